"""Fitting the scaling law (smelt_interp.analysis.scaling.law) to a runs table, with
bootstrap intervals.

The fit follows Epoch AI's replication of Chinchilla (Besiroglu et al. 2024): in log space,

    log L = LSE(log A + b log(1 - S) - a log F,  log K - c log D,  log E),

minimising the summed Huber loss (delta 1e-3) of the log-loss residuals with L-BFGS-B from
a grid of starts and keeping the best. With S = 0 and F = N this *is* Epoch's fit, so
`chinchilla_runs(path)` + `fit()` reproduces their numbers (a test checks it).

Identifiability: b multiplies log(1 - S), so when every run has the same S it is confounded
with A. The fit then fixes b (to `fix_b`, default 0: A absorbs (1 - S)^b) and records this in
`ScalingFit.notes` and `ScalingFit.b_fixed`; predictions at a different S are then only as
good as the assumed b.

To keep a grid of thousands of starts fast, the objective is vectorised with an analytic
gradient, the whole grid is scored in one pass, and L-BFGS runs from the best-scoring starts
(`n_starts`; None runs every start, exactly as Epoch did). Bootstrap refits (runs resampled
with replacement) start from the full-data optimum and the best grid starts."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits

from smelt_interp.analysis.resampling import check_resamples
from smelt_interp.analysis.scaling.law import PARAM_NAMES, Law, frontier
from smelt_interp.analysis.scaling.runs import check_pairs, validate_runs
from smelt_interp.errors import FitError, RunsError, SmeltError
from smelt_interp.measure.intervals import percentile_ci

HUBER_DELTA = 1e-3
MAX_FIXED_B = 100.0  # a fixed sparsity exponent beyond this overflows (1 - S)^b
# One bootstrap refit: 0.24 s measured on the nine-run CPU ladder of one architecture (two
# shared cores), and about 500 bytes for the refitted Law.
SECONDS_PER_REFIT = 0.24
BYTES_PER_REFIT = 500

# Epoch's grid of starts (analyzing-chinchilla): alpha, beta in 0..2 step .5, e in -1..1
# step .5, log A, log K in 0..25 step 5; plus the sparsity exponent b when it is free.
DEFAULT_GRID: dict[str, tuple[float, ...]] = {
    "log_A": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
    "b": (0.0, 0.5, 1.0, 2.0),
    "a": (0.0, 0.5, 1.0, 1.5, 2.0),
    "log_K": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
    "c": (0.0, 0.5, 1.0, 1.5, 2.0),
    "log_E": (-1.0, -0.5, 0.0, 0.5, 1.0),
}
_THETA_ORDER = ("log_A", "b", "a", "log_K", "c", "log_E")  # internal parameter vector
_LBFGS_OPTIONS = {"ftol": 1e-14, "gtol": 1e-11, "maxiter": 5000}


@dataclass(frozen=True)
class _Problem:
    """Log-space data and the fixed/free split of the parameter vector.

    Parameters enter as theta = (log A, b, a, log K, c, log E). Internally log F and log D are
    centred (log F - cF), and the optimiser works on u = theta with log A - a cF and
    log K - c cD in place of log A and log K: the same model, but without the near-perfect
    correlation between log A and a (log F ~ 20) that otherwise makes L-BFGS stall short of
    the optimum. Results are always returned as theta."""

    log_F: np.ndarray  # centred: log F - cF
    log_1mS: np.ndarray
    log_D: np.ndarray  # centred: log D - cD
    log_L: np.ndarray
    delta: float
    free: np.ndarray  # bool mask over _THETA_ORDER
    fixed_theta: np.ndarray  # values used where ~free
    cF: float = 0.0
    cD: float = 0.0

    @classmethod
    def build(
        cls,
        F: np.ndarray,
        S: np.ndarray,
        D: np.ndarray,
        loss: np.ndarray,
        delta: float,
        fixed_b: float | None,
    ) -> _Problem:
        free = np.arange(6) != 1 if fixed_b is not None else np.ones(6, dtype=bool)
        fixed = np.where(np.arange(6) == 1, fixed_b or 0.0, 0.0)
        log_F, log_D = np.log(F), np.log(D)
        cF, cD = float(log_F.mean()), float(log_D.mean())
        return cls(
            log_F - cF, np.log1p(-S), log_D - cD, np.log(loss), float(delta), free, fixed, cF, cD
        )

    def subset(self, idx: np.ndarray) -> _Problem:
        return replace(
            self,
            log_F=self.log_F[idx],
            log_1mS=self.log_1mS[idx],
            log_D=self.log_D[idx],
            log_L=self.log_L[idx],
        )

    def with_fixed_b(self, b: float) -> _Problem:
        return replace(
            self, free=np.arange(6) != 1, fixed_theta=np.where(np.arange(6) == 1, b, 0.0)
        )

    def to_u(self, theta: np.ndarray) -> np.ndarray:
        u = np.array(theta, dtype=float)
        u[..., 0] -= u[..., 2] * self.cF
        u[..., 3] -= u[..., 4] * self.cD
        return u

    def to_theta(self, u: np.ndarray) -> np.ndarray:
        theta = np.array(u, dtype=float)
        theta[..., 0] += theta[..., 2] * self.cF
        theta[..., 3] += theta[..., 4] * self.cD
        return theta

    def _full(self, x: np.ndarray) -> np.ndarray:
        u = self.fixed_theta.copy()
        u[self.free] = x
        return u

    def objective(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        """Summed Huber loss of (predicted - observed) log-loss at free internal parameters x,
        and its gradient (softmax weights of the three LSE terms times the clipped residual)."""
        la, b, a, lk, c, le = self._full(x)
        t = np.stack(
            [
                la + b * self.log_1mS - a * self.log_F,
                lk - c * self.log_D,
                np.full_like(self.log_F, le),
            ]
        )
        m = t.max(axis=0)
        w = np.exp(t - m)
        s = w.sum(axis=0)
        r = m + np.log(s) - self.log_L
        w /= s
        ar = np.abs(r)
        d = self.delta
        value = float(np.where(ar <= d, 0.5 * r * r, d * (ar - 0.5 * d)).sum())
        g = np.clip(r, -d, d)
        g0, g1 = g * w[0], g * w[1]
        grad = np.array(
            [
                g0.sum(),
                (g0 * self.log_1mS).sum(),
                -(g0 * self.log_F).sum(),
                g1.sum(),
                -(g1 * self.log_D).sum(),
                (g * w[2]).sum(),
            ]
        )
        return value, grad[self.free]

    def screen(self, thetas: np.ndarray, chunk: int = 2048) -> np.ndarray:
        """Objective at many parameter vectors theta at once (no gradient)."""
        us = self.to_u(thetas)
        out = np.empty(len(us))
        d = self.delta
        for i in range(0, len(us), chunk):
            P = us[i : i + chunk, :, None]
            t1 = P[:, 0] + P[:, 1] * self.log_1mS - P[:, 2] * self.log_F
            t2 = P[:, 3] - P[:, 4] * self.log_D
            r = np.logaddexp(np.logaddexp(t1, t2), P[:, 5]) - self.log_L
            ar = np.abs(r)
            out[i : i + chunk] = np.where(ar <= d, 0.5 * r * r, d * (ar - 0.5 * d)).sum(axis=1)
        return out

    def minimise(self, starts: np.ndarray) -> tuple[np.ndarray, float, bool]:
        """L-BFGS-B from each start theta; the best theta, its objective and success flag.

        Tolerances are tighter than scipy's defaults because its ftol is relative to
        max(|f|, 1) and this objective is ~1e-3 or less."""
        best: tuple[np.ndarray, float, bool] | None = None
        for u0 in self.to_u(starts):
            res = minimize(
                self.objective,
                u0[self.free],
                jac=True,
                method="L-BFGS-B",
                bounds=[_BOUNDS[i] for i in np.flatnonzero(self.free)],
                options=_LBFGS_OPTIONS,
            )
            if np.isfinite(res.fun) and (best is None or res.fun < best[1]):
                best = (self.to_theta(self._full(res.x)), float(res.fun), bool(res.success))
        if best is None:
            raise FitError("L-BFGS found no finite optimum from any start")
        return best


# L-BFGS-B box on the internal parameters (log A, b, a, log K, c, log E): exponents stay in a
# physical range, so a few collinear runs cannot send a to -80 with A at 1e-113.
_BOUNDS = [(None, None), (-10.0, 10.0), (0.0, 3.0), (None, None), (0.0, 3.0), (None, None)]
# Below this spread of log(1 - S) across runs, b is confounded with a (S tracks F) and is fixed.
MIN_LOG_DENSITY_SPREAD = 0.25


def _log_density_spread(S: pd.Series | None) -> float:
    if S is None:
        return 0.0
    values = np.log1p(-S.dropna().clip(upper=1 - 1e-12).to_numpy(dtype=float))
    return float(values.max() - values.min()) if values.size else 0.0


def _grid_thetas(grid: Mapping[str, Sequence[float]], fixed_b: float | None) -> np.ndarray:
    axes = [
        list(grid[name]) if not (name == "b" and fixed_b is not None) else [fixed_b]
        for name in _THETA_ORDER
    ]
    return np.array(list(itertools.product(*axes)), dtype=float)


@dataclass(frozen=True)
class ScalingFit:
    """A fitted law with its bootstrap, residuals and diagnostics.

    `ci[name] = (lo, hi)` is the percentile bootstrap interval at `ci_level`; `bootstrap` holds
    the refitted laws (one per resample) for intervals on derived quantities; `residuals` are
    log(observed) - log(predicted), one per run, indexed like the input table."""

    law: Law
    ci: dict[str, tuple[float, float]]
    ci_level: float
    bootstrap: tuple[Law, ...]
    residuals: pd.Series
    objective: float
    converged: bool
    b_fixed: bool
    S_ref: float
    n_runs: int
    huber_delta: float
    notes: tuple[str, ...] = field(default=())

    E = property(lambda self: self.law.E)
    A = property(lambda self: self.law.A)
    a = property(lambda self: self.law.a)
    b = property(lambda self: self.law.b)
    K = property(lambda self: self.law.K)
    c = property(lambda self: self.law.c)

    @property
    def params(self) -> dict[str, float]:
        return self.law.as_dict()

    @property
    def n_params(self) -> int:
        return 5 if self.b_fixed else 6

    def predict(self, F, S, D) -> np.ndarray:
        return self.law.predict(F, S, D)

    def frontier(
        self, budgets: Iterable[float], S: float | None = None, *, verify: bool = True
    ) -> pd.DataFrame:
        return frontier(self, budgets, S, verify=verify)

    def summary(self) -> pd.DataFrame:
        """One row per parameter: estimate, interval, and whether it was fixed."""
        rows = []
        for name in PARAM_NAMES:
            lo, hi = self.ci.get(name, (math.nan, math.nan))
            rows.append(
                {
                    "param": name,
                    "estimate": getattr(self, name),
                    "lo": lo,
                    "hi": hi,
                    "fixed": name == "b" and self.b_fixed,
                }
            )
        return pd.DataFrame(rows).set_index("param")

    def to_dict(self) -> dict:
        return {
            "params": self.params,
            "ci": {k: list(v) for k, v in self.ci.items()},
            "ci_level": self.ci_level,
            "n_bootstrap": len(self.bootstrap),
            "objective": self.objective,
            "converged": self.converged,
            "b_fixed": self.b_fixed,
            "S_ref": self.S_ref,
            "n_runs": self.n_runs,
            "huber_delta": self.huber_delta,
            "residual_rms": float(np.sqrt(np.mean(self.residuals.to_numpy() ** 2))),
            "notes": list(self.notes),
        }


def _bootstrap(
    problem: _Problem, theta: np.ndarray, grid_starts: np.ndarray, n_bootstrap: int, seed: int
) -> tuple[list[Law], int]:
    """Refit `n_bootstrap` resamples of the runs (with replacement) from the full-data optimum
    and the best grid starts; returns the laws and the number of failed refits."""
    rng = np.random.default_rng(seed)
    starts = np.vstack([theta[None], grid_starts])
    n = len(problem.log_L)
    boot: list[Law] = []
    failed = 0
    for _ in range(n_bootstrap):
        sub = problem.subset(rng.integers(0, n, size=n))
        if problem.free[1] and np.ptp(sub.log_1mS) == 0:
            # the resample hit a single sparsity: hold b at the full-data estimate
            sub = sub.with_fixed_b(float(theta[1]))
        try:
            boot.append(Law.from_theta(sub.minimise(starts)[0]))
        except (FitError, OverflowError):
            failed += 1
    return boot, failed


def _check_options(
    huber_delta: float,
    seed: int,
    fix_b: float | None,
    n_bootstrap: int,
    ci_level: float,
    n_starts: int | None,
) -> None:
    """FitError for an option of `fit` out of its range (checked before the runs are read)."""
    if not huber_delta > 0:
        raise FitError(f"huber_delta must be positive, got {huber_delta}")
    if seed < 0:
        raise FitError(f"seed must be >= 0, got {seed}")
    if fix_b is not None and not abs(fix_b) <= MAX_FIXED_B:  # NaN fails this too
        raise FitError(f"fix_b must be a number within -+{MAX_FIXED_B:g}, got {fix_b}")
    if n_bootstrap < 0:
        raise FitError(f"n_bootstrap must be >= 0, got {n_bootstrap}")
    check_resamples(n_bootstrap, SECONDS_PER_REFIT, BYTES_PER_REFIT, "a bootstrap of")
    if not 0 < ci_level < 1:
        raise FitError(f"ci_level must be in (0, 1), got {ci_level}")
    if n_starts is not None and n_starts < 1:
        raise FitError(f"n_starts must be >= 1 or None, got {n_starts}")


def _sparsity_exponent(runs: pd.DataFrame, fix_b: float | None) -> tuple[float | None, list[str]]:
    """(the value b is held at, or None to fit it; the notes saying why): `fix_b` where given,
    0 where S is constant or spans too little of log(1 - S) to separate b from a."""
    S_col = pd.to_numeric(runs["S"], errors="coerce") if "S" in runs.columns else None
    constant_S = S_col is not None and S_col.nunique(dropna=True) <= 1
    spread = _log_density_spread(S_col)
    notes: list[str] = []
    b_value = fix_b
    if fix_b is None and constant_S:
        b_value = 0.0
        s0 = float(S_col.iloc[0]) if len(S_col) else math.nan
        notes.append(
            f"S is constant ({s0:g}) across runs, so b is not identifiable: fixed b = 0 "
            f"(A absorbs (1 - S)^b); pass fix_b to assume another value"
        )
    elif fix_b is None and spread < MIN_LOG_DENSITY_SPREAD:
        b_value = 0.0
        notes.append(
            f"S varies too little across runs (log(1 - S) spans {spread:.3f} < "
            f"{MIN_LOG_DENSITY_SPREAD}) to separate b from a: fixed b = 0 (A absorbs "
            f"(1 - S)^b); pass fix_b to assume another value"
        )
    elif fix_b is not None:
        notes.append(f"b fixed at {fix_b:g} by the caller")
    return b_value, notes


def _intervals(boot: list[Law], ci_level: float) -> dict:
    """{parameter: percentile interval at `ci_level`} over the bootstrap's laws ({} if none)."""
    if not boot:
        return {}
    table = np.array([[getattr(l, p) for p in PARAM_NAMES] for l in boot])
    return {p: percentile_ci(table[:, j], ci_level) for j, p in enumerate(PARAM_NAMES)}


def fit(
    runs: pd.DataFrame,
    *,
    n_bootstrap: int = 100,
    seed: int = 0,
    huber_delta: float = HUBER_DELTA,
    fix_b: float | None = None,
    grid: Mapping[str, Sequence[float]] | None = None,
    n_starts: int | None = 32,
    bootstrap_starts: int = 4,
    ci_level: float = 0.95,
) -> ScalingFit:
    """Fit L = E + A (1-S)^b / F^a + K / D^c to `runs` (columns F, S, D, loss; others ignored).

    Minimises the summed Huber loss (`huber_delta`) of log-loss residuals by L-BFGS-B from the
    `n_starts` best-scoring points of `grid` (None: every point), keeping the best optimum.
    `fix_b` fixes the sparsity exponent; when S is constant across runs b is unidentifiable and
    is fixed to `fix_b` or 0 (noted in the result). `n_bootstrap` resamples of the runs (with
    replacement, seeded by `seed`) are refitted for percentile intervals at `ci_level`."""
    _check_options(huber_delta, seed, fix_b, n_bootstrap, ci_level, n_starts)
    grid = {**DEFAULT_GRID, **(grid or {})}

    if not isinstance(runs, pd.DataFrame):
        raise RunsError(f"runs must be a pandas DataFrame, got {type(runs).__name__}")
    check_pairs(runs)
    b_value, notes = _sparsity_exponent(runs, fix_b)
    b_fixed = b_value is not None
    data = validate_runs(runs, n_params=5 if b_fixed else 6)

    problem = _Problem.build(
        data["F"].to_numpy(),
        data["S"].to_numpy(),
        data["D"].to_numpy(),
        data["loss"].to_numpy(),
        huber_delta,
        b_value,
    )

    thetas = _grid_thetas(grid, b_value)
    # L-BFGS-B calls BLAS on vectors of six numbers thousands of times; idle OpenBLAS worker
    # threads spinning between calls make each call ~15x slower on busy cores, so use one.
    with threadpool_limits(limits=1, user_api="blas"):
        order = np.argsort(problem.screen(thetas), kind="stable")
        starts = thetas[order if n_starts is None else order[:n_starts]]
        theta, value, success = problem.minimise(starts)
        boot, failed = _bootstrap(
            problem, theta, thetas[order[:bootstrap_starts]], n_bootstrap, seed
        )
    law = Law.from_theta(theta)
    if not success:
        notes.append("L-BFGS-B reported no convergence at the best start")
    if failed:
        notes.append(f"{failed} of {n_bootstrap} bootstrap refits failed and were dropped")
    ci = _intervals(boot, ci_level)
    predicted = law.predict(data["F"], data["S"], data["D"])
    residuals = pd.Series(
        np.log(data["loss"].to_numpy()) - np.log(predicted), index=data.index, name="log_residual"
    )
    return ScalingFit(
        law=law,
        ci=ci,
        ci_level=ci_level,
        bootstrap=tuple(boot),
        residuals=residuals,
        objective=value,
        converged=success,
        b_fixed=b_fixed,
        S_ref=float(np.median(data["S"])),
        n_runs=len(data),
        huber_delta=float(huber_delta),
        notes=tuple(notes),
    )


def fit_by_arch(
    runs: pd.DataFrame, column: str = "arch", *, seed: int = 0, **kwargs
) -> dict[str, ScalingFit]:
    """Fit each architecture (value of `column`) separately; keys in order of first appearance.
    Pairs (rows sharing a `size`) must share one S (check_pairs)."""
    if not isinstance(runs, pd.DataFrame):
        raise RunsError(f"runs must be a pandas DataFrame, got {type(runs).__name__}")
    if column not in runs.columns:
        raise RunsError(f"runs table lacks column {column!r}")
    if runs[column].isna().any():
        raise RunsError(f"column {column} has {int(runs[column].isna().sum())} missing values")
    if runs.empty:
        raise RunsError("runs table has no rows")
    check_pairs(runs, column)
    fits: dict[str, ScalingFit] = {}
    for i, name in enumerate(pd.unique(runs[column])):
        group = runs[runs[column] == name]
        try:
            fits[str(name)] = fit(group, seed=seed + i, **kwargs)
        except SmeltError as exc:
            raise type(exc)(f"{column} {name!r}: {exc}") from None
    return fits
