"""Runs tables: reading one from a CSV (a ladder's, or Epoch's Chinchilla extraction) and
validating it before a fit, with one-line RunsErrors that name the column and count at fault.

A Baseline and its matched SMELT share one S (the paper's grid; smelt_interp.budget), so in a
ladder's runs table (columns `arch` and `size`) every row of a size must carry the same S:
`check_pairs` refuses a table whose pairs mix sparsities, which would put the two architectures
in different S cells and let b absorb the difference."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from smelt_interp.errors import DataError, RunsError

REQUIRED_COLUMNS = ("F", "S", "D", "loss")
# Largest values a run may have: far beyond any real run, small enough that compute F*D, the
# budgets and the fit's powers stay finite floats.
MAX_VALUE = {"F": 1e60, "D": 1e60, "loss": 1e6}


def validate_runs(runs: pd.DataFrame, n_params: int = 6) -> pd.DataFrame:
    """Check a runs table (columns F, S, D, loss) and return those columns as floats.

    Raises RunsError with a one-line message naming the first problem found."""
    if not isinstance(runs, pd.DataFrame):
        raise RunsError(f"runs must be a pandas DataFrame, got {type(runs).__name__}")
    missing = [c for c in REQUIRED_COLUMNS if c not in runs.columns]
    if missing:
        names = ", ".join(repr(c) for c in missing)
        raise RunsError(f"runs table lacks column{'s' if len(missing) > 1 else ''} {names}")
    out = {}
    for col in REQUIRED_COLUMNS:
        values = pd.to_numeric(runs[col], errors="coerce")
        bad = int(values.isna().sum() - runs[col].isna().sum())
        if bad:
            raise RunsError(f"column {col} has {bad} non-numeric value{'s' * (bad != 1)}")
        arr = values.to_numpy(dtype=float)
        n_nan = int(np.isnan(arr).sum())
        if n_nan:
            raise RunsError(f"column {col} has {n_nan} missing (NaN) value{'s' * (n_nan != 1)}")
        n_inf = int(np.isinf(arr).sum())
        if n_inf:
            raise RunsError(f"column {col} has {n_inf} infinite value{'s' * (n_inf != 1)}")
        if col == "S":
            n_out = int(((arr < 0) | (arr >= 1)).sum())
            if n_out:
                raise RunsError(f"column S has {n_out} value{'s' * (n_out != 1)} outside [0, 1)")
        else:
            n_neg = int((arr <= 0).sum())
            if n_neg:
                raise RunsError(f"column {col} has {n_neg} non-positive value{'s' * (n_neg != 1)}")
            n_big = int((arr > MAX_VALUE[col]).sum())
            if n_big:
                raise RunsError(
                    f"column {col} has {n_big} value{'s' * (n_big != 1)} above "
                    f"{MAX_VALUE[col]:g}, beyond what the fit can use"
                )
        out[col] = arr
    _check_compute(out["F"], out["D"])
    n = len(runs)
    if n < n_params + 1:
        raise RunsError(f"need at least {n_params + 1} runs to fit {n_params} parameters, got {n}")
    return pd.DataFrame(out, index=runs.index)


def _check_compute(F: np.ndarray, D: np.ndarray) -> None:
    """The compute F * D of every run is a positive float (it does not underflow to 0)."""
    with np.errstate(under="ignore", over="ignore"):
        n_zero = int((F * D == 0).sum())
    if n_zero:
        raise RunsError(
            f"columns F and D: the compute F * D of {n_zero} run{'s' * (n_zero != 1)} is below "
            f"the smallest float ({np.finfo(float).tiny:.3g}); express F and D in larger units"
        )


def check_pairs(
    runs: pd.DataFrame, arch_column: str = "arch", pair_column: str = "size", rtol: float = 1e-9
) -> None:
    """Refuse (one-line RunsError) a runs table in which the rows of one pair (same
    `pair_column` value, across architectures and horizons) carry different S. Tables without
    both columns hold no pairs and pass. `rtol` absorbs a CSV round trip's last digit."""
    if not isinstance(runs, pd.DataFrame) or not {arch_column, pair_column, "S"} <= set(
        runs.columns
    ):
        return
    table = pd.DataFrame(
        {
            "pair": runs[pair_column].to_numpy(),
            "arch": runs[arch_column].to_numpy(),
            "S": pd.to_numeric(runs["S"], errors="coerce").to_numpy(),
        }
    ).dropna()
    for key, group in table.groupby("pair", sort=False):
        lo, hi = group["S"].min(), group["S"].max()
        if hi - lo <= rtol * max(abs(hi), 1.0):
            continue
        by_arch = ", ".join(
            f"{arch} {', '.join(f'{v:.4f}' for v in pd.unique(g['S']))}"
            for arch, g in group.groupby("arch", sort=False)
        )
        raise RunsError(
            f"{pair_column} {key}: a matched pair shares one S, but its runs carry {by_arch} "
            "(both models of a size carry the Baseline's S, budget.pair_sparsity)"
        )


def chinchilla_runs(path: str | Path, drop_highest: int = 5) -> pd.DataFrame:
    """Epoch's extraction of the Chinchilla runs (the CSV at `path`; the repository keeps a
    copy in tests/data/) as a runs table: F = N (model size), S = 0, D = training FLOP / (6 N),
    loss; the `drop_highest` highest-loss runs removed, as in Epoch's replication."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"Chinchilla data not found at {path}")
    raw = pd.read_csv(path)
    for col in ("Model Size", "Training FLOP", "loss"):
        if col not in raw.columns:
            raise DataError(f"{path.name} lacks column {col!r}")
    N = raw["Model Size"].astype(float)
    runs = pd.DataFrame(
        {
            "F": N,
            "S": 0.0,
            "D": raw["Training FLOP"].astype(float) / (6.0 * N),
            "loss": raw["loss"].astype(float),
        }
    )
    if drop_highest:
        runs = runs.drop(runs["loss"].nlargest(drop_highest).index)
    return runs.reset_index(drop=True)


def default_budgets(runs: pd.DataFrame) -> list[float]:
    """Decades from the smallest run's compute to two decades beyond the largest."""
    C = validate_runs(runs, n_params=0).pipe(lambda r: (r["F"] * r["D"]).to_numpy())
    lo, hi = math.floor(math.log10(C.min())), math.ceil(math.log10(C.max())) + 2
    return [10.0**k for k in range(lo, hi + 1)]


def read_runs(path: str | Path) -> pd.DataFrame:
    """Read a runs CSV (a regular file of at most 64 MiB, see files.open_input), turning
    parser failures into a one-line RunsError."""
    from smelt_interp.files import open_input

    try:
        with open_input(path, 64 * 2**20, RunsError, "runs table") as fh:
            return pd.read_csv(fh)
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as exc:
        msg = " ".join(str(exc).split())
        raise RunsError(f"cannot read {path}: {msg}") from None
