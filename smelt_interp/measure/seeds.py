"""Figures over training seeds: the mean of each statistic with a Student-t interval over seeds
(seeds are the unit that varies between runs, so a seed-to-seed spread, not a row bootstrap,
says how far another run's figure may land)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

LEVEL = 0.95


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, lo, hi): mean -+ t_{(1 + level) / 2, n - 1} * sd / sqrt(n), sd with n - 1 degrees
    of freedom; lo and hi are NaN for a single value (no spread to measure)."""
    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def over_seeds(
    per_seed: pd.DataFrame, keys: Sequence[str], columns: Sequence[str], level: float = LEVEL
) -> pd.DataFrame:
    """One row per `keys` group of `per_seed` (one row per seed and group): for each of
    `columns` its mean over the seeds and `_lo`/`_hi` t interval, and `n_seeds`."""
    rows = []
    for group, part in per_seed.groupby(list(keys), sort=False):
        row = dict(zip(keys, group if isinstance(group, tuple) else (group,)))
        row["n_seeds"] = len(part)
        for col in columns:
            mean, lo, hi = t_interval(part[col].tolist(), level)
            row |= {col: mean, f"{col}_lo": lo, f"{col}_hi": hi}
        rows.append(row)
    return pd.DataFrame(rows)
