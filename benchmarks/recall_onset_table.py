"""Markdown onset curves of recall runs from the trainer's own evaluation log (metrics.jsonl):
one row per run, at each `--at` token count (the nearest evaluation at or after it) the BOS mass
at non-answer positions of the head that holds most at the end, then the sink that head held
(the lowest of its last HOLD_EVALS evaluations: commands.run_log.held_sink), its demonstration
mass at answer positions and the answer accuracy at the last evaluation.

    python -m benchmarks.recall_onset_table runs/recall-lp/*/baseline [--at 0.5,1,2,3,4]"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.sink_control_table import at_or_after, onset_table_main
from smelt_interp.commands.run_log import BOS_NON_ANSWER, held_sink, log_records
from smelt_interp.measure.sink import HOLD_EVALS

DEMO_ANSWER = "case/demo_answer/"


def curve(run_dir: Path, at_millions: list[float]) -> str:
    """One markdown row of the run in `run_dir`."""
    evals = [r for _, r in log_records(run_dir) if r.get("event") == "eval" and "branch" not in r]
    head, held = held_sink(run_dir)
    if head == "none":  # too few evaluations to hold anything: follow the last one's top head
        last_bos = {k: v for k, v in evals[-1].items() if k.startswith(BOS_NON_ANSWER)}
        head = max(last_bos, key=last_bos.__getitem__).removeprefix(BOS_NON_ANSWER)
    cells = []
    for m in at_millions:
        point = at_or_after(evals, m)
        cells.append("-" if point is None else f"{point[BOS_NON_ANSWER + head]:.2f}")
    last = evals[-1]
    tail = [
        f"{last['tokens'] / 1e6:.1f}M: {last[BOS_NON_ANSWER + head]:.2f}",
        "-" if math.isnan(held) else f"{held:.2f}",
        head,
        f"{last[DEMO_ANSWER + head]:.2f}",
        f"{last['case/answer_acc']:.2f}",
    ]
    return f"| {run_dir.parent.name} | " + " | ".join(cells + tail) + " |"


def main(argv: list[str] | None = None) -> int:
    tail = ["BOS at the last", f"held (lowest of the last {HOLD_EVALS})", "head"]
    tail += ["its demo mass", "answer acc"]
    return onset_table_main(
        argv, __doc__, curve, tail, "0.5,1,2,3,4", "run folders holding metrics.jsonl"
    )


if __name__ == "__main__":
    raise SystemExit(main())
