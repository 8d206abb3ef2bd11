"""`python -m smelt_interp.budget`: the budget-matched SMELT config for a Baseline shape, with
both shapes side by side and the mismatch of parameters, FLOPs and KV cache; `--results OUT.md`
also writes the budgets as a results file (smelt_interp.results) for the README to cite.
`--kernel-friendly` matches with head widths that are multiples of 64 and d_model and d_expert
multiples of 128 or 64 (budget.kernel); where the Baseline must change for such a pair to
exist, it prints today's pair (the matcher's steps as given) and the kernel-friendly one."""

from __future__ import annotations

import sys
from argparse import Namespace
from collections.abc import Sequence

import pandas as pd

from smelt_interp.budget import (
    Budget,
    Match,
    match_kernel_friendly,
    match_smelt,
    mismatch_table,
)
from smelt_interp.budget.matcher import D_HEAD_MULTIPLES
from smelt_interp.cli import ArgumentParser, int_at_least, run_cli
from smelt_interp.config import ModelConfig
from smelt_interp.errors import MatchError
from smelt_interp.files import check_outputs
from smelt_interp.results import command_line, markdown_table, table_block, write_results

TODAY = "today's pair: the Baseline as given, matched at the steps given"
KERNEL = "kernel-friendly pair"


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
    p.add_argument(
        "--d-head-multiple", type=int, default=2, choices=D_HEAD_MULTIPLES, help="SMELT's d_head"
    )
    p.add_argument("--width-step", type=int_at_least(1), help="SMELT's d_model step")
    p.add_argument("--expert-step", type=int_at_least(1), default=8, help="its d_expert step")
    p.add_argument(
        "--kernel-friendly",
        action="store_true",
        help="head widths multiples of 64, d_model and d_expert of 128 or 64 (the Baseline's "
        "n_kv_heads changed if it must be; then both pairs are shown)",
    )
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
    pairs = _pairs(base, args)
    print("\n\n".join(_shown(title, m, args.seq_len) for _, title, m in pairs))
    if args.results:
        argv = sys.argv[1:] if argv is None else list(argv)
        title = f"Budgets of a Baseline and its matched SMELT at seq_len {args.seq_len}"
        tables = [table_block(name, budget_table(m, args.seq_len)) for name, _, m in pairs if m]
        changed = pairs[-1][2]
        if changed is not None and changed.baseline != base:
            title = f"Budgets of today's and the kernel-friendly pair at seq_len {args.seq_len}"
            moved = baseline_change(base, changed.baseline, args.seq_len)
            tables.append(table_block("baselines", moved))
        command = command_line("smelt_interp.budget", argv)
        path = write_results(args.results, title, command, tables)
        print(f"wrote {path}")
    return 0


def baseline_change(base: ModelConfig, other: ModelConfig, seq_len: int) -> str:
    """The budgets of the Baseline a kernel-friendly pair needed against today's, as Markdown."""
    table = mismatch_table(base, other, seq_len)
    rows = [
        [name, f"{r.baseline:,.0f}", f"{r.smelt:,.0f}", f"{r.mismatch:+.2%}"]
        for name, r in table.iterrows()
    ]
    return markdown_table(
        ["budget", "today's baseline", "kernel-friendly baseline", "change"], rows
    )


def _shown(title: str, match: Match | None, seq_len: int) -> str:
    """One pair as printed: its title line, if any, over its shapes and budgets."""
    parts = [title] if title else []
    if match is not None:
        parts.append(_format_pair(match, seq_len))
    return "\n".join(parts)


def _pairs(base: ModelConfig, args: Namespace) -> list[tuple[str, str, Match | None]]:
    """(results table name, title, pair) of each pair to show: the matched pair (untitled), or
    the kernel-friendly one, after today's (or the reason it has none) when the kernel-friendly
    one needed another Baseline."""
    steps = {
        "seq_len": args.seq_len,
        "n_loops": args.n_loops,
        "width_step": args.width_step,
        "expert_step": args.expert_step,
        "d_head_multiple": args.d_head_multiple,
    }
    if not args.kernel_friendly:
        return [("budgets", "", match_smelt(base, **steps))]
    kernel = match_kernel_friendly(base, seq_len=args.seq_len, n_loops=args.n_loops)
    if kernel.baseline == base:
        return [("budgets", f"{KERNEL}, the Baseline as given", kernel)]
    moved = mismatch_table(base, kernel.baseline, args.seq_len)["mismatch"]
    title = (
        f"{KERNEL}: the Baseline's n_kv_heads {base.n_kv_heads} -> {kernel.baseline.n_kv_heads} "
        f"(against today's Baseline: {', '.join(f'{q} {v:+.2%}' for q, v in moved.items())})"
    )
    try:
        today: tuple[str, str, Match | None] = ("budgets-today", TODAY, match_smelt(base, **steps))
    except MatchError as exc:
        today = ("budgets-today", f"{TODAY}: none ({exc})", None)
    return [today, ("budgets-kernel-friendly", title, kernel)]


if __name__ == "__main__":
    run_cli(main)
