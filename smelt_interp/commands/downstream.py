"""`python -m smelt_interp.analysis.downstream BASELINE.pt SMELT.pt [--plot OUT.html] [--json
OUT]` (or `smelt-downstream`): compare a Baseline and a SMELT checkpoint, print the three
tables and write them as JSON and figures (plotly only when --plot asks for it)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from smelt_interp.analysis.downstream.compare import (
    BYTES_PER_RESAMPLE,
    SECONDS_PER_RESAMPLE,
    compare,
    compare_bytes,
)
from smelt_interp.analysis.resampling import check_resamples
from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.cli import ArgumentParser, int_at_least, require_memory, run_cli
from smelt_interp.data.sources import source_path
from smelt_interp.files import atomic_write_many, check_outputs, json_text


def downstream_main(argv: Sequence[str] | None = None) -> int:
    """Compare a Baseline and a SMELT checkpoint; print the three tables, write JSON/HTML."""
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
    check_resamples(args.bootstrap, SECONDS_PER_RESAMPLE, BYTES_PER_RESAMPLE, "--bootstrap")
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


if __name__ == "__main__":
    run_cli(downstream_main)
