"""`python -m smelt_interp.analysis.scaling RUNS.csv [--plot OUT.html] [--json OUT] ...` (or
`smelt-scaling`, or `python -m smelt_interp.commands.scaling`): fit
each architecture of a runs CSV, print the parameters, the compute-optimal frontier and SMELT's
compute savings, and write them as JSON, figures and a results file (`--results`, what it printed
with the command and commit; smelt_interp.results). The command sits at the top of the
import graph (docs/design.md): it may import the figures, which the scaling modules may not;
plotly is imported only when --plot asks for it."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from smelt_interp.analysis.resampling import check_resamples
from smelt_interp.analysis.scaling import (
    BYTES_PER_REFIT,
    HUBER_DELTA,
    SECONDS_PER_REFIT,
    ScalingFit,
    chinchilla_runs,
    compute_savings,
    default_budgets,
    fit,
    fit_by_arch,
    frontier,
    read_runs,
)
from smelt_interp.cli import ArgumentParser, int_at_least, run_cli
from smelt_interp.config import BASELINE, SMELT
from smelt_interp.errors import FitError, RunsError
from smelt_interp.files import atomic_write_many, check_outputs, json_text
from smelt_interp.results import command_line, recording


def _parse_budgets(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RunsError(f"--budgets must be comma-separated numbers, got {text!r}") from None
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise RunsError(f"--budgets must be positive numbers, got {text!r}")
    return values


def _pair(fits: Mapping[str, ScalingFit]) -> tuple[str, str] | None:
    """The (baseline, smelt) keys, matched case-insensitively, if both are present."""
    lower = {k.lower(): k for k in fits}
    if BASELINE in lower and SMELT in lower:
        return lower[BASELINE], lower[SMELT]
    return None


def _format_params(name: str, f: ScalingFit) -> str:
    lines = [
        f"{name}: {f.n_runs} runs, {f.n_params} free parameters, Huber delta {f.huber_delta:g}, "
        f"{len(f.bootstrap)} bootstrap fits ({f.ci_level:.0%} intervals), "
        f"residual RMS {np.sqrt(np.mean(f.residuals**2)):.4f}"
    ]
    for p, row in f.summary().iterrows():
        interval = (
            "fixed"
            if row["fixed"]
            else (f"[{row['lo']:.4g}, {row['hi']:.4g}]" if np.isfinite(row["lo"]) else "")
        )
        lines.append(f"  {p:<2} {row['estimate']:>12.5g}  {interval}")
    lines += [f"  note: {n}" for n in f.notes]
    return "\n".join(lines)


def _print_savings(
    savings: pd.DataFrame, fits: Mapping[str, ScalingFit], base: str, smelt: str
) -> None:
    print(
        f"compute savings of {smelt} over {base} at equal loss "
        f"(S_{base} = {fits[base].S_ref:g}, S_{smelt} = {fits[smelt].S_ref:g}):"
    )
    shown = savings.copy()
    for col in [c for c in shown.columns if c.startswith("savings")]:
        shown[col] = shown[col].map(lambda v: f"{100 * v:.1f}%" if np.isfinite(v) else "n/a")
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def scaling_main(argv: Sequence[str] | None = None) -> int:
    """Fit each architecture of a runs CSV, print parameters, frontier and savings."""
    parser = ArgumentParser(
        prog="python -m smelt_interp.analysis.scaling",
        description="Fit L = E + A (1-S)^b / F^a + K / D^c per architecture, report the "
        "compute-optimal frontier and SMELT's compute savings over the Baseline.",
    )
    parser.add_argument("runs", help="CSV with columns F, S, D, loss (and optionally arch)")
    parser.add_argument(
        "--chinchilla",
        action="store_true",
        help="RUNS is Epoch AI's extraction of the Chinchilla runs (a copy is in tests/data)",
    )
    parser.add_argument(
        "--budgets",
        type=str,
        default=None,
        help="comma-separated compute budgets C = F*D (default: decades over the runs)",
    )
    parser.add_argument(
        "--bootstrap",
        type=int_at_least(0),
        default=100,
        metavar="N",
        help="bootstrap refits (default 100)",
    )
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--huber-delta", type=float, default=HUBER_DELTA)
    parser.add_argument("--fix-b", type=float, default=None, help="fix the sparsity exponent b")
    parser.add_argument("--arch-column", default="arch")
    parser.add_argument("--plot", metavar="OUT.html", help="write loss-vs-compute figures as HTML")
    parser.add_argument(
        "--json", metavar="OUT", help="write parameters, frontier and savings as JSON"
    )
    parser.add_argument("--results", metavar="OUT.md", help="write what it prints as results")
    args = parser.parse_args(argv)
    check_resamples(args.bootstrap, SECONDS_PER_REFIT, BYTES_PER_REFIT, "--bootstrap")
    outputs = {"--json": args.json, "--plot": args.plot, "--results": args.results}
    check_outputs({"RUNS": args.runs}, outputs)
    budgets = _parse_budgets(args.budgets) if args.budgets else None
    runs = chinchilla_runs(args.runs) if args.chinchilla else read_runs(args.runs)
    command = command_line("smelt_interp.analysis.scaling", sys.argv[1:] if argv is None else argv)
    with recording(f"Scaling fit of {args.runs}", command) as record:
        report, fits, savings = _report(runs, budgets, args)
    texts = {args.json: json_text(report, indent=2)} if args.json else {}
    if args.results:
        texts[args.results] = record.text
    if args.plot:
        from smelt_interp.figures.scaling import scaling_html  # plotly only when asked for

        budgets = budgets or default_budgets(runs)
        texts[args.plot] = scaling_html(fits, runs, budgets, savings, arch_column=args.arch_column)
    for path in atomic_write_many(texts):  # all or none
        print(f"wrote {path}")
    return 0


def _report(
    runs: pd.DataFrame, budgets: list[float] | None, args: argparse.Namespace
) -> tuple[dict, dict[str, ScalingFit], pd.DataFrame | None]:
    """Fit, print and collect the parameters, frontiers and savings of `runs`."""
    kwargs = dict(n_bootstrap=args.bootstrap, huber_delta=args.huber_delta, fix_b=args.fix_b)
    if args.arch_column in runs.columns:
        fits = fit_by_arch(runs, args.arch_column, seed=args.seed, **kwargs)
    else:
        fits = {"all": fit(runs, seed=args.seed, **kwargs)}
    budgets = budgets or default_budgets(runs)

    pd.set_option("display.width", 120)
    report: dict = {"fits": {}, "savings": None}
    frontiers = {}
    for name, f in fits.items():
        print(_format_params(name, f))
        try:
            frontiers[name] = frontier(f, budgets)
            print(f"  compute-optimal frontier at S = {f.S_ref:g}:")
            print(frontiers[name].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        except FitError as exc:
            print(f"  no frontier: {exc}")
        print()
        report["fits"][name] = {
            **f.to_dict(),
            "frontier": frontiers[name].to_dict("records") if name in frontiers else None,
        }

    savings = None
    pair = _pair(fits)
    if pair:
        try:
            savings = compute_savings(fits[pair[0]], fits[pair[1]], budgets)
        except FitError as exc:
            print(f"no savings table: {exc}")
        if savings is not None:
            _print_savings(savings, fits, *pair)
            report["savings"] = savings.to_dict("records")
    elif len(fits) > 1:
        print(f"no savings table: need arch values {BASELINE!r} and {SMELT!r}")
    return report, fits, savings


if __name__ == "__main__":
    run_cli(scaling_main)
