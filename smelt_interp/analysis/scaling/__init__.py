"""Scaling laws for Baseline and SMELT: the law with its frontier and compute savings (`law`),
the fit with bootstrap intervals (`fit`), and reading and validating runs tables (`runs`).

    python -m smelt_interp.analysis.scaling RUNS.csv [--plot OUT.html] [--json OUT] ...

runs the command (smelt_interp.commands.scaling), which prints and draws what these modules
compute."""

from smelt_interp.analysis.scaling.fit import (
    BYTES_PER_REFIT,
    DEFAULT_GRID,
    HUBER_DELTA,
    SECONDS_PER_REFIT,
    ScalingFit,
    fit,
    fit_by_arch,
)
from smelt_interp.analysis.scaling.law import PARAM_NAMES, Law, compute_savings, frontier
from smelt_interp.analysis.scaling.runs import (
    REQUIRED_COLUMNS,
    check_pairs,
    chinchilla_runs,
    default_budgets,
    read_runs,
    validate_runs,
)

__all__ = [
    "BYTES_PER_REFIT",
    "DEFAULT_GRID",
    "HUBER_DELTA",
    "PARAM_NAMES",
    "REQUIRED_COLUMNS",
    "SECONDS_PER_REFIT",
    "Law",
    "ScalingFit",
    "check_pairs",
    "chinchilla_runs",
    "compute_savings",
    "default_budgets",
    "fit",
    "fit_by_arch",
    "frontier",
    "read_runs",
    "validate_runs",
]
