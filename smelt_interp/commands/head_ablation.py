"""`python -m smelt_interp.commands.head_ablation CKPT [--n-rows N] [--seq-len T]` (also
`python -m smelt_interp.probes.head_ablation ...`): the head ablation of a checkpoint trained on
associative recall (probes.head_ablation), printed as a table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from smelt_interp.cli import ArgumentParser, int_at_least, run_cli
from smelt_interp.probes.head_ablation import DEFAULT_ROWS, ablate_checkpoint


def main(argv: Sequence[str] | None = None) -> int:
    """Mean-ablate a recall checkpoint's retrieval and parked heads; print the table."""
    p = ArgumentParser(
        prog="python -m smelt_interp.probes.head_ablation",
        description="Mean-ablate a recall checkpoint's retrieval and parked heads on held-out "
        "rows and print answer accuracy and non-answer loss before and after.",
    )
    p.add_argument("ckpt", type=Path, help="a checkpoint trained on associative recall")
    p.add_argument("--n-rows", type=int_at_least(1), default=DEFAULT_ROWS)
    p.add_argument("--seq-len", type=int_at_least(2), default=None)
    p.add_argument("--seed", type=int_at_least(0), default=0)
    args = p.parse_args(argv)
    result = ablate_checkpoint(args.ckpt, args.n_rows, args.seq_len, args.seed)
    print(result.table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    return 0


if __name__ == "__main__":
    run_cli(main)
