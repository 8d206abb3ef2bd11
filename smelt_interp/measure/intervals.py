"""Percentile bootstrap intervals of pooled means over rows (prompts): the resampling weights,
the pooled means of every resample from per-row sums and counts, and the percentile interval.
Pooling (sum of sums over sum of counts) weighs each row by its positions, as the point value
does, so a resample only redraws which rows count."""

from __future__ import annotations

import numpy as np

N_RESAMPLES = 1000
LEVEL = 0.95


def resample_weights(n: int, n_resamples: int = N_RESAMPLES, seed: int = 0) -> np.ndarray:
    """[n_resamples, n]: how often each of n rows is drawn in each bootstrap resample
    (n draws with replacement), seeded."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_resamples).astype(np.float64)


def pooled(sums: np.ndarray, counts: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, ...]:
    """Pooled means sums.sum(0) / counts.sum() ([n, ...] -> [...]) and, per bootstrap resample
    (rows of `weights`), the same pooled mean of the resampled rows: (point, boot)."""
    flat = sums.reshape(sums.shape[0], -1)
    point = flat.sum(axis=0) / counts.sum()
    boot = (weights @ flat) / (weights @ counts)[:, None]
    return point.reshape(sums.shape[1:]), boot.reshape((-1, *sums.shape[1:]))


def interval(boot: np.ndarray, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval over the resamples (axis 0)."""
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(boot, [tail, 100 - tail], axis=0)
    return lo, hi
