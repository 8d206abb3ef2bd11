"""The two analysis commands, kept out of the computation modules so that those import neither
argparse nor the figures:

    python -m smelt_interp.analysis.scaling RUNS.csv [--plot OUT.html] [--json OUT] ...
    python -m smelt_interp.analysis.downstream BASELINE.pt SMELT.pt [--plot OUT.html] ...

Each computation module runs the matching `*_main` here from its `__main__` guard. This module
sits at the top of the import graph (docs/design.md): it may import the figures, which the
analysis modules may not. The downstream command's imports (torch, the model) and the figures'
(plotly) wait until a command needs them, so the scaling fit starts in a fraction of a second."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from smelt_interp.analysis.scaling import (
    HUBER_DELTA,
    ScalingFit,
    compute_savings,
    default_budgets,
    fit,
    fit_by_arch,
    frontier,
    read_runs,
)
from smelt_interp.atomic import atomic_write_many, check_outputs, json_text
from smelt_interp.cli import ArgumentParser, int_at_least, require_memory
from smelt_interp.errors import FitError, RunsError

# --------------------------------------------------------------------------------------
# python -m smelt_interp.analysis.scaling
# --------------------------------------------------------------------------------------


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
    if "baseline" in lower and "smelt" in lower:
        return lower["baseline"], lower["smelt"]
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
    args = parser.parse_args(argv)
    check_outputs({"RUNS": args.runs}, {"--json": args.json, "--plot": args.plot})
    budgets = _parse_budgets(args.budgets) if args.budgets else None
    runs = read_runs(args.runs)
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
        print("no savings table: need arch values 'baseline' and 'smelt'")

    texts = {args.json: json_text(report, indent=2)} if args.json else {}
    if args.plot:
        from smelt_interp.figures.scaling import scaling_html  # plotly only when asked for

        texts[args.plot] = scaling_html(fits, runs, budgets, savings, arch_column=args.arch_column)
    for path in atomic_write_many(texts):  # all or none
        print(f"wrote {path}")
    return 0


# --------------------------------------------------------------------------------------
# python -m smelt_interp.analysis.downstream
# --------------------------------------------------------------------------------------


def downstream_main(argv: Sequence[str] | None = None) -> int:
    """Compare a Baseline and a SMELT checkpoint; print the three tables, write JSON/HTML."""
    from smelt_interp.analysis.downstream import compare, compare_bytes
    from smelt_interp.checkpoint import load_checkpoint
    from smelt_interp.data.sources import source_path

    p = ArgumentParser(
        prog="python -m smelt_interp.analysis.downstream",
        description="Loss gain of SMELT over Baseline by domain, length and demonstrations.",
    )
    p.add_argument("baseline")
    p.add_argument("smelt")
    p.add_argument("--data", default="code,arith,dyck", help="comma-separated sources or paths")
    p.add_argument("--n-docs", type=int_at_least(1), default=64)
    p.add_argument("--n-dyck", type=int_at_least(1), default=200)
    p.add_argument("--bootstrap", type=int_at_least(0), default=200)
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--json", help="write the three tables as JSON")
    p.add_argument("--plot", help="write the figures as one HTML page")
    args = p.parse_args(argv)
    sources = [s for s in args.data.split(",") if s]
    paths = {f"--data {s}": source_path(s) for s in sources}
    inputs = {"BASELINE": args.baseline, "SMELT": args.smelt, **paths}
    check_outputs(inputs, {"--json": args.json, "--plot": args.plot})
    (base, _), (smelt, _) = load_checkpoint(args.baseline), load_checkpoint(args.smelt)
    longest = max(base.cfg.max_seq_len, smelt.cfg.max_seq_len)
    require_memory(
        compare_bytes(longest, len(sources), args.n_docs, args.n_dyck),
        f"--n-docs {args.n_docs} and --n-dyck {args.n_dyck}",
    )
    report = compare(
        base,
        smelt,
        sources,
        n_docs=args.n_docs,
        n_dyck=args.n_dyck,
        n_boot=args.bootstrap,
        seed=args.seed,
    )
    pd.set_option("display.width", 160)
    for title, table in (
        ("gain by domain (1 - CE_smelt / CE_baseline)", report.by_domain),
        ("gain by sample length (tokens)", report.by_length),
        ("Dyck exact match by in-context examples", report.by_demos),
    ):
        print(f"\n{title}\n{table.to_string(index=False, float_format=lambda x: f'{x:.4f}')}")
    texts = {args.json: json_text(report.to_json(), indent=2)} if args.json else {}
    if args.plot:
        from smelt_interp.figures.downstream import report_html

        texts[args.plot] = report_html(report)
    atomic_write_many(texts)  # all or none
    return 0
