"""The scaling law of the SMELT paper and what follows from it in closed form:

    L(F, S, D) = E + A (1 - S)^b / F^a + K / D^c

with F the per-token forward FLOPs, S the compute-equivalent sparsity and D the training
tokens. Under a compute budget C = F * D the optimal split of C between model size and data
gives the frontier L_opt(C) (`frontier`); SMELT's compute savings at budget C is
1 - C_smelt / C, where C_smelt is the compute SMELT needs to reach the Baseline's optimal loss
at C (`compute_savings`). Both check their closed forms against a numerical search."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd
from scipy.optimize import brentq, minimize_scalar

from smelt_interp.errors import FitError
from smelt_interp.measure.intervals import percentile_ci

PARAM_NAMES = ("E", "A", "a", "b", "K", "c")


@dataclass(frozen=True)
class Law:
    """One set of scaling-law parameters, with the closed forms derived from it."""

    E: float
    A: float
    a: float
    b: float
    K: float
    c: float

    @classmethod
    def from_theta(cls, theta: np.ndarray) -> Law:
        la, b, a, lk, c, le = (float(x) for x in theta)
        return cls(E=math.exp(le), A=math.exp(la), a=a, b=b, K=math.exp(lk), c=c)

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in PARAM_NAMES}

    def predict(self, F, S, D) -> np.ndarray:
        """Loss at per-token FLOPs F, sparsity S and tokens D (arrays broadcast)."""
        F, S, D = (np.asarray(x, dtype=float) for x in (F, S, D))
        return self.E + self.A * (1.0 - S) ** self.b / F**self.a + self.K / D**self.c

    def _effective_A(self, S: float) -> float:
        return self.A * (1.0 - float(S)) ** self.b

    def _check_frontier(self) -> None:
        for name in ("a", "c"):
            value = getattr(self, name)
            if not value > 0:
                raise FitError(
                    f"no compute-optimal frontier: exponent {name} = {value:.4g} is not positive"
                )

    def optimal_split(self, C, S: float) -> tuple[np.ndarray, np.ndarray]:
        """(F_opt, D_opt) minimising L at compute C = F * D and fixed S.

        Setting dL/dF = 0 with D = C / F gives Chinchilla's closed form
        F_opt = G C^(c/(a+c)), G = (a A (1-S)^b / (c K))^(1/(a+c)), D_opt = C / F_opt."""
        self._check_frontier()
        C = np.asarray(C, dtype=float)
        G = (self.a * self._effective_A(S) / (self.c * self.K)) ** (1.0 / (self.a + self.c))
        F_opt = G * C ** (self.c / (self.a + self.c))
        return F_opt, C / F_opt

    def optimal_loss(self, C, S: float) -> np.ndarray:
        """Loss on the frontier: L_opt(C) = E + B C^-gamma, gamma = a c / (a + c)."""
        F_opt, D_opt = self.optimal_split(C, S)
        return self.predict(F_opt, S, D_opt)

    def compute_for_loss(self, L, S: float) -> np.ndarray:
        """Smallest compute whose optimal loss is L (inverse of `optimal_loss`); inf for L <= E."""
        self._check_frontier()
        L = np.asarray(L, dtype=float)
        gamma = self.a * self.c / (self.a + self.c)
        B = float(self.optimal_loss(1.0, S)) - self.E  # L_opt(C) - E = B C^-gamma
        excess = L - self.E
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            C = np.where(excess > 0, (np.maximum(excess, 1e-300) / B) ** (-1.0 / gamma), np.inf)
        return C


class FittedLaw(Protocol):
    """What the frontier and the savings read of a fit (fit.ScalingFit is one): the fitted law,
    the median training sparsity, the interval level and the bootstrap's refitted laws. Named
    here so this module needs nothing from fit.py, which builds on it."""

    @property
    def law(self) -> Law: ...
    @property
    def S_ref(self) -> float: ...
    @property
    def ci_level(self) -> float: ...
    @property
    def bootstrap(self) -> Sequence[Law]: ...


def _budgets(budgets: Iterable[float]) -> np.ndarray:
    C = np.atleast_1d(
        np.asarray(list(budgets) if not isinstance(budgets, np.ndarray) else budgets, dtype=float)
    )
    if C.size == 0 or not np.all(np.isfinite(C)) or np.any(C <= 0):
        raise FitError("compute budgets must be a non-empty list of positive numbers")
    return C


def frontier(
    fit_: FittedLaw | Law, budgets: Iterable[float], S: float | None = None, *, verify: bool = True
) -> pd.DataFrame:
    """Compute-optimal F, D and loss per budget C = F * D at fixed sparsity S (default: the
    median S of the fitted runs). With `verify`, each closed-form optimum is checked against a
    bounded numerical minimisation over log F and a FitError raised on disagreement."""
    law = fit_ if isinstance(fit_, Law) else fit_.law
    if S is None:
        S = 0.0 if isinstance(fit_, Law) else fit_.S_ref
    C = _budgets(budgets)
    F_opt, D_opt = law.optimal_split(C, S)
    L_opt = law.predict(F_opt, S, D_opt)
    if verify:
        for c_, f_, l_ in zip(C, F_opt, L_opt):
            x0 = math.log(f_)
            res = minimize_scalar(
                lambda x: float(law.predict(math.exp(x), S, c_ / math.exp(x))),
                bounds=(x0 - 5.0, x0 + 5.0),
                method="bounded",
                options={"xatol": 1e-9},
            )
            if res.fun < l_ * (1 - 1e-9) or abs(res.x - x0) > 1e-3:
                raise FitError(
                    f"closed-form frontier disagrees with numerical search at C = {c_:.3g}"
                )
    return pd.DataFrame({"C": C, "F_opt": F_opt, "D_opt": D_opt, "L_opt": L_opt})


def compute_savings(
    fit_base: FittedLaw,
    fit_smelt: FittedLaw,
    budgets: Iterable[float],
    S_base: float | None = None,
    S_smelt: float | None = None,
    *,
    ci_level: float | None = None,
    verify: bool = True,
) -> pd.DataFrame:
    """SMELT's compute savings at equal loss, per Baseline budget C.

    L_base = the Baseline's optimal loss at C (sparsity S_base); C_smelt = the compute at which
    SMELT's frontier (sparsity S_smelt) reaches L_base; savings = 1 - C_smelt / C (negative when
    SMELT needs more, -inf when it cannot reach L_base). Intervals pair the i-th bootstrap fit of
    each architecture. S defaults to each fit's median training sparsity."""
    S_base = fit_base.S_ref if S_base is None else float(S_base)
    S_smelt = fit_smelt.S_ref if S_smelt is None else float(S_smelt)
    level = ci_level or min(fit_base.ci_level, fit_smelt.ci_level)
    C = _budgets(budgets)

    def savings_of(base: Law, smelt: Law) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        target = base.optimal_loss(C, S_base)
        C_s = smelt.compute_for_loss(target, S_smelt)
        return target, C_s, 1.0 - C_s / C

    L_base, C_smelt, savings = savings_of(fit_base.law, fit_smelt.law)
    if verify:
        for l_, c_s in zip(L_base, C_smelt):
            if not np.isfinite(c_s):
                continue
            f = lambda x: float(fit_smelt.law.optimal_loss(math.exp(x), S_smelt)) - l_
            root = brentq(f, math.log(c_s) - 5.0, math.log(c_s) + 5.0, xtol=1e-12)
            if abs(root - math.log(c_s)) > 1e-6:
                raise FitError("closed-form compute-for-loss disagrees with root finding")
    out = pd.DataFrame({"C": C, "L_base": L_base, "C_smelt": C_smelt, "savings": savings})
    n = min(len(fit_base.bootstrap), len(fit_smelt.bootstrap))
    if n:
        boot = np.empty((n, len(C)))
        for i in range(n):
            try:
                boot[i] = savings_of(fit_base.bootstrap[i], fit_smelt.bootstrap[i])[2]
            except FitError:  # a resample without an interior frontier
                boot[i] = np.nan
        cis = [percentile_ci(boot[~np.isnan(boot[:, j]), j], level) for j in range(len(C))]
        out["savings_lo"] = [lo for lo, _ in cis]
        out["savings_hi"] = [hi for _, hi in cis]
    return out
