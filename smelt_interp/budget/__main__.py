"""`python -m smelt_interp.budget`: the budget-matched SMELT config for a Baseline shape, with
both shapes side by side and the mismatch of parameters, FLOPs and KV cache; `--results OUT.md`
also writes the budgets as a results file (smelt_interp.results) for the README to cite."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pandas as pd

from smelt_interp.budget import Budget, Match, match_smelt
from smelt_interp.cli import ArgumentParser, run_cli
from smelt_interp.config import ModelConfig
from smelt_interp.files import check_outputs
from smelt_interp.results import command_line, markdown_table, table_block, write_results


def _format_pair(match: Match, seq_len: int) -> str:
    fields = [
        "d_model",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "d_head",
        "n_experts",
        "top_k",
        "d_expert",
        "loop_start",
        "loop_end",
        "n_loops",
        "effective_depth",
    ]
    rows = []
    for f in fields:
        rows.append(
            {"field": f, "baseline": getattr(match.baseline, f), "smelt": getattr(match.smelt, f)}
        )
    shapes = pd.DataFrame(rows).set_index("field")
    table = match.table.copy()
    table["mismatch"] = table["mismatch"].map(lambda x: f"{x:+.2%}")
    table["tolerance"] = table["tolerance"].map(lambda x: f"{x:.0%}")
    for col in ("baseline", "smelt"):
        table[col] = table[col].map(lambda x: f"{x:,.0f}")
    return (
        f"{shapes.to_string()}\n\nbudgets at seq_len {seq_len} (flops per token, kv bytes per "
        f"token in bf16)\n{table.to_string()}\n\nsparsity S of the pair: {match.sparsity:.4f} "
        "(1 - FLOPs / FLOPs of a dense control with the same non-embedding parameters); "
        f"SMELT's own count: {Budget.of(match.smelt, seq_len).sparsity:.4f}"
    )


def budget_table(match: Match, seq_len: int) -> str:
    """The three budgets, their mismatches and the pair's sparsity as a Markdown table."""
    rows = [
        [name, f"{r.baseline:,.0f}", f"{r.smelt:,.0f}", f"{r.mismatch:+.2%}", f"{r.tolerance:.0%}"]
        for name, r in match.table.iterrows()
    ]
    own = Budget.of(match.smelt, seq_len).sparsity
    rows.append(["sparsity S", f"{match.sparsity:.4f} (the pair's)", f"{own:.4f} (own)", "", ""])
    return markdown_table(["budget", "baseline", "smelt", "mismatch", "tolerance"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m smelt_interp.budget",
        description="Print the budget-matched SMELT config for a Baseline shape.",
    )
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--n-layers", type=int, default=12)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--n-kv-heads", type=int, default=4)
    p.add_argument("--d-head", type=int, default=64)
    p.add_argument("--n-experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--d-expert", type=int, default=256)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--n-loops", type=int, default=2)
    p.add_argument("--results", metavar="OUT.md", help="also write the budgets as a results file")
    args = p.parse_args(argv)
    check_outputs({}, {"--results": args.results})
    base = ModelConfig.baseline(
        d_model=args.d_model,
        n_layers=args.n_layers,
        n_heads=args.n_heads,
        n_kv_heads=args.n_kv_heads,
        d_head=args.d_head,
        n_experts=args.n_experts,
        top_k=args.top_k,
        d_expert=args.d_expert,
        max_seq_len=args.seq_len,
    )
    match = match_smelt(base, seq_len=args.seq_len, n_loops=args.n_loops)
    print(_format_pair(match, args.seq_len))
    if args.results:
        argv = sys.argv[1:] if argv is None else list(argv)
        title = f"Budgets of a Baseline and its matched SMELT at seq_len {args.seq_len}"
        table = table_block("budgets", budget_table(match, args.seq_len))
        command = command_line("smelt_interp.budget", argv)
        path = write_results(args.results, title, command, [table])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_cli(main)
