"""Every interval the workbench reports, in one place:

- `wilson_interval`: a proportion's Wilson score interval (exact-match accuracies);
- `t_interval`: a mean's Student-t interval (figures over training seeds, where seeds are the
  unit that varies between runs);
- percentile bootstraps: `resample_weights`, `pooled` and `interval` for pooled means over rows
  (prompts; pooling weighs each row by its positions, as the point value does, so a resample
  only redraws which rows count), `bootstrap_interval` for any statistic of resampled items,
  and `percentile_ci` for a set of bootstrap estimates that may hold +-inf."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

N_RESAMPLES = 1000
LEVEL = 0.95


def wilson_interval(hits: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The Wilson score interval of a proportion hits / n (scipy's binomtest, no continuity
    correction); (0, 1) with no trials, where nothing is known."""
    if n == 0:
        return (0.0, 1.0)
    ci = stats.binomtest(int(hits), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return (float(ci.low), float(ci.high))


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


def bootstrap_interval(
    stat: Callable[[np.ndarray], float], n_items: int, n_boot: int, seed: int, level: float = LEVEL
) -> tuple[float, float]:
    """Percentile interval of stat(indices) over resamples of the items."""
    if n_items < 2 or n_boot < 1:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    values = [stat(rng.integers(0, n_items, n_items)) for _ in range(n_boot)]
    lo, hi = np.nanquantile(values, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def percentile_ci(values: np.ndarray, level: float) -> tuple[float, float]:
    """The central `level` interval of `values` (NaN when none is finite)."""
    finite = values[np.isfinite(values)]
    if len(finite) == 0:
        return (math.nan, math.nan)
    q = (1.0 - level) / 2.0
    # "nearest" copes with +-inf (an unreachable loss) without producing NaN
    lo, hi = np.quantile(values, [q, 1.0 - q], method="nearest")
    return float(lo), float(hi)
