"""Figures over training seeds, the one home of every over-seed summary. Seeds are the unit that
varies between runs, and a handful of them is all there is: masses and accuracies are bounded,
and over seeds often two-peaked (one seed parks a head, the others do not). So a summary gives
what such data support: the mean, the median, the range (lowest and highest seed) and how many
seeds lie above each of THRESHOLDS, and an interval only where it means something: a percentile
bootstrap of the mean over seeds (resampling whole seeds), which stays inside the seeds' range
and so inside [0, 1] for a mass, and none from fewer than MIN_SEEDS seeds (a bootstrap of two
values, or a t interval with one degree of freedom, says nothing)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from smelt_interp.measure.intervals import LEVEL, N_RESAMPLES, bootstrap_interval

THRESHOLDS = (0.3, 0.5)
MIN_SEEDS = 3  # fewer seeds give no interval
BOOT_SEED = 0


@dataclass(frozen=True)
class SeedSummary:
    """One statistic over seeds: n seeds (NaN values left out), mean, median, lowest, highest,
    `above` {threshold: seeds strictly above it}, and lo/hi, the percentile bootstrap interval of
    the mean over seeds (NaN from fewer than MIN_SEEDS seeds)."""

    n: int
    mean: float
    median: float
    lowest: float
    highest: float
    above: dict[float, int]
    lo: float
    hi: float


def seed_summary(
    values: Sequence[float],
    *,
    thresholds: Sequence[float] = THRESHOLDS,
    level: float = LEVEL,
    n_resamples: int = N_RESAMPLES,
    seed: int = BOOT_SEED,
) -> SeedSummary:
    """The summary of one statistic's per-seed `values` (None and NaN left out)."""
    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    above = {t: int((x > t).sum()) for t in thresholds}
    if len(x) == 0:
        return SeedSummary(0, *(math.nan,) * 4, above, math.nan, math.nan)  # type: ignore[arg-type]
    lo = hi = math.nan
    if len(x) >= MIN_SEEDS:  # whole seeds resampled; the mean of each resample
        lo, hi = bootstrap_interval(
            lambda idx: float(x[idx].mean()), len(x), n_resamples, seed, level
        )
    return SeedSummary(
        len(x), float(x.mean()), float(np.median(x)), float(x.min()), float(x.max()), above, lo, hi
    )


def threshold_column(column: str, threshold: float) -> str:
    """The name of the column counting seeds of `column` above `threshold` (x_above_0.3)."""
    return f"{column}_above_{threshold:g}"


def over_seeds(
    per_seed: pd.DataFrame,
    keys: Sequence[str],
    columns: Sequence[str],
    level: float = LEVEL,
    thresholds: Sequence[float] = THRESHOLDS,
) -> pd.DataFrame:
    """One row per `keys` group of `per_seed` (one row per seed and group): `n_seeds` and, for
    each of `columns`, its mean, `_lo`/`_hi` (seed_summary's bootstrap interval), `_median`,
    `_min`, `_max` and, per threshold, the seeds above it (threshold_column)."""
    rows = []
    for group, part in per_seed.groupby(list(keys), sort=False):
        row = dict(zip(keys, group if isinstance(group, tuple) else (group,)))
        row["n_seeds"] = len(part)
        for col in columns:
            s = seed_summary(part[col].tolist(), thresholds=thresholds, level=level)
            row |= {col: s.mean, f"{col}_lo": s.lo, f"{col}_hi": s.hi}
            row |= {f"{col}_median": s.median, f"{col}_min": s.lowest, f"{col}_max": s.highest}
            row |= {threshold_column(col, t): n for t, n in s.above.items()}
        rows.append(row)
    return pd.DataFrame(rows)
