"""A run's metrics log read after training: the sink it held over its last evaluations (the
lowest of the last HOLD_EVALS per head, the best head) against a hand-made log, with branch
records, train records and a torn last line that must not count."""

from __future__ import annotations

import json
import math

import pytest

from smelt_interp.commands.run_log import held_sink
from smelt_interp.measure.sink import HOLD_EVALS, held_mass

KEY = "case/bos_non_answer/"


def write_log(path, evals: dict[str, list[float]], extra: list[str] = ()) -> None:
    lines = []
    n = len(next(iter(evals.values())))
    for i in range(n):
        lines.append(json.dumps({"event": "train", "step": i, "tokens_per_s": 100.0}))
        record = {"event": "eval", "step": i} | {KEY + h: v[i] for h, v in evals.items()}
        lines.append(json.dumps(record))
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("\n".join([*lines, *extra]) + "\n")


def test_held_mass_is_the_lowest_of_the_last_evaluations():
    assert HOLD_EVALS == 5
    assert held_mass([0.9, 0.1, 0.8, 0.7, 0.6, 0.55, 0.52]) == 0.52
    assert held_mass([0.1, 0.9, 0.9, 0.9, 0.9, 0.9]) == 0.9  # the early 0.1 is outside
    assert math.isnan(held_mass([0.9, 0.9, 0.9, 0.9]))  # too few to say it held
    assert held_mass([0.2, 0.4], last=2) == 0.2


def test_the_held_sink_is_the_best_head_over_its_last_five_evaluations(tmp_path):
    passing = [0.1, 0.95, 0.9, 0.2, 0.92, 0.93, 0.94]  # parks, leaves at the 4th eval, returns
    staying = [0.05, 0.3, 0.6, 0.61, 0.62, 0.63, 0.64]
    write_log(tmp_path, {"1.0.0": passing, "2.1.0": staying})
    head, mass = held_sink(tmp_path)
    # by hand: head 1.0.0 holds min(0.9, 0.2, 0.92, 0.93, 0.94) = 0.2; head 2.1.0 holds 0.6
    assert head == "2.1.0" and mass == pytest.approx(0.6)


def test_branch_records_and_a_torn_last_line_do_not_count(tmp_path):
    extra = [
        json.dumps({"event": "eval", "branch": "b", KEY + "1.0.0": 0.0}),
        '{"event": "eval", "case/bos_non_answer/1.0.0": 0.0',  # killed mid-write
    ]
    write_log(tmp_path, {"1.0.0": [0.7] * 6}, extra)
    (tmp_path / "metrics.jsonl").write_text((tmp_path / "metrics.jsonl").read_text()[:-1])
    assert held_sink(tmp_path) == ("1.0.0", pytest.approx(0.7))


def test_a_run_with_too_few_evaluations_holds_none(tmp_path):
    write_log(tmp_path, {"1.0.0": [0.9] * 4})
    head, mass = held_sink(tmp_path)
    assert head == "none" and math.isnan(mass)


def test_the_recall_onset_table_follows_the_held_head(tmp_path):
    from benchmarks.recall_onset_table import curve

    run = tmp_path / "lp" / "baseline"
    records = []
    pairs = [(0.1, 0.0), (0.2, 0.6), (0.3, 0.7), (0.2, 0.8), (0.1, 0.6)]
    pairs += [(0.1, 0.6), (0.2, 0.6), (0.3, 0.7), (0.2, 0.8), (0.1, 0.6)]
    for i, (a, b) in enumerate(pairs):
        records.append(
            {"event": "eval", "step": i, "tokens": (i + 1) * 1e6, "case/answer_acc": 0.5 + i / 20}
            | {KEY + "1.0.0": a, KEY + "3.0.0": b}
            | {"case/demo_answer/1.0.0": 0.2, "case/demo_answer/3.0.0": 0.9}
        )
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    # head 3.0.0 holds min(0.6, 0.6, 0.7, 0.8, 0.6) = 0.6; at 2M tokens (the 2nd eval) it reads
    # 0.6, at 9.5M (the 10th) 0.6; its last demo mass 0.9; accuracy 0.5 + 9 / 20
    assert (
        curve(run, [2, 9.5, 20])
        == "| lp | 0.60 | 0.60 | - | 10.0M: 0.60 | 0.60 | 3.0.0 | 0.90 | 0.95 |"
    )
