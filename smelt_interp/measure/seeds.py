"""Figures over training seeds: the mean of each statistic with a Student-t interval over seeds
(seeds are the unit that varies between runs, so a seed-to-seed spread, not a row bootstrap,
says how far another run's figure may land)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from smelt_interp.measure.intervals import LEVEL, t_interval


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
