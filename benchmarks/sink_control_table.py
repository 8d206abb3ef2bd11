"""Markdown onset curves from benchmarks.sink_control runs: one row per run, the BOS mass at
non-trigger positions of each head at every `--at` token count (the nearest evaluation at or
after it), the lowest BOS mass over the last HOLD_EVALS evaluations (the positive control's target
holds when it is at least 0.5: a sink that stays, not one that passes), then the last
evaluation's previous-token mass at triggers, BOS value-norm ratio and copy accuracy.

    python -m benchmarks.sink_control_table runs/sink_control/*/onset.jsonl [--at 1,2,4,6]"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from smelt_interp.measure.sink import HOLD_EVALS, held_mass


def at_or_after(points: list[dict], millions: float) -> dict | None:
    """The first evaluation at or after `millions` tokens (the onset tables' --at cells)."""
    return next((p for p in points if p["tokens"] >= millions * 1e6), None)


def curve(path: Path, at_millions: list[float]) -> str:
    """One markdown row of the run logged at `path`."""
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    header, points = lines[0], lines[1:]
    cells = []
    for m in at_millions:
        point = at_or_after(points, m)
        cells.append(
            "-" if point is None else " / ".join(f"{h['bos']:.3f}" for h in point["heads"].values())
        )
    last = points[-1]
    heads = last["heads"].values()
    lowest = [held_mass([p["heads"][k]["bos"] for p in points]) for k in last["heads"]]
    tail = [
        f"{last['tokens'] / 1e6:.1f}M: " + " / ".join(f"{h['bos']:.3f}" for h in heads),
        " / ".join(f"{v:.3f}" for v in lowest),
        " / ".join(f"{h['prev_trig']:.2f}" for h in heads),
        " / ".join(f"{h['vratio']:.2f}" for h in heads),
        f"{last['copy_acc']:.2f}",
        f"{last['seconds']:.0f} s, {header['threads']} thread(s)",
    ]
    return f"| {path.parent.name} | " + " | ".join(cells + tail) + " |"


def onset_table_main(
    argv: list[str] | None,
    doc: str,
    curve_row: Callable[[Path, list[float]], str],
    tail_columns: list[str],
    default_at: str,
    inputs_help: str,
) -> int:
    """The command shared by the onset tables: paths and --at token counts in, a Markdown
    table out, one row per path from `curve_row`; the BOS columns at --at, then `tail_columns`."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", type=Path, help=inputs_help)
    p.add_argument("--at", default=default_at, help="token counts, in millions")
    args = p.parse_args(argv)
    at = [float(x) for x in args.at.split(",")]
    cols = [f"BOS @{m:g}M" for m in at] + tail_columns
    print("| run | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for path in args.inputs:
        print(curve_row(path, at))
    return 0


def main(argv: list[str] | None = None) -> int:
    tail = ["BOS at the last", f"BOS, lowest of the last {HOLD_EVALS}", "prev @trig"]
    tail += ["v ratio", "copy", "time"]
    return onset_table_main(argv, __doc__, curve, tail, "1,2,4,6", "onset.jsonl logs")


if __name__ == "__main__":
    raise SystemExit(main())
