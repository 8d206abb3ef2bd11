"""The seeds report written again from its JSON: seeds left out are gone from every table and
said so, the over-seed cells carry no interval, the visit pairs' exact tests match a hand count,
and bad input is one line and exit 2 with nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.bad_input import run_command

from smelt_interp.commands.seed_rerender import rerender_main

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
MODULE = "smelt_interp.commands.seed_rerender"


@pytest.fixture
def report(tmp_path) -> Path:
    path = tmp_path / "recall_seeds.json"
    shutil.copy(RESULTS / "recall_seeds.json", path)
    return path


def test_seeds_left_out_and_exact_tests(report):
    assert rerender_main([str(report), "--drop-seeds", "0", "--why", "chosen on seed 0."]) == 0
    text = report.with_suffix(".md").read_text()
    assert "Seeds left out: 0. chosen on seed 0." in text and "Over 4 seeds" in text
    assert "95% percentile bootstrap over seeds]" not in text
    assert "| 0 | baseline |" not in text and "| 1 | baseline |" in text  # per-seed rows
    payload = json.loads(report.read_text())
    pairs = [r for r in payload["per_seed"]["visit_pairs"] if r["layer"] == 1 and r["seed"]]
    demo = sorted((r["seed"], r["demo_mean"]) for r in pairs)
    cell = ", ".join(f"{s}: {v:+.3f}" for s, v in demo)
    negative = sum(v < 0 for _, v in demo)
    line = next(x for x in text.splitlines() if x.startswith("| smelt | 1 | demo, head mean |"))
    assert cell in line and f"{negative} -, {4 - negative} +" in line
    # all of one sign over 4 seeds: the exact two-sided p is 2 / 2^4
    assert negative in (0, 4) and "sign p = 0.125" in line
    assert "<!-- table: paper-comparison -->" in text


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"task": "dyck", "per_seed": {}}))
    code, _, err = run_command(MODULE, bad)
    assert code == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.md").exists()
    bad.write_text("{not json")
    code, _, err = run_command(MODULE, bad)
    assert code == 2 and "not valid JSON" in err


def test_the_paper_comparison_is_the_difference_in_differences_by_hand(report):
    """Layer 1's visits run at effective depths 1 and 3 (schedule 0, 1, 2, 1, 2, 3): SMELT's
    change against the Baseline's layer 3 minus its layer 1, per seed."""
    assert rerender_main([str(report), "--drop-seeds", "0"]) == 0
    text = report.with_suffix(".md").read_text()
    visits = json.loads(report.read_text())["per_seed"]["by_visit"]
    mass = {(r["seed"], r["model"], r["layer"], r["visit"]): r["demo_mean"] for r in visits}
    cells = []
    for seed in (1, 2, 3, 4):
        smelt = mass[seed, "smelt", 1, 1] - mass[seed, "smelt", 1, 0]
        base = mass[seed, "baseline", 3, 0] - mass[seed, "baseline", 1, 0]
        cells.append(f"{seed}: {smelt - base:+.3f}")
    line = next(
        x for x in text.splitlines() if x.startswith("| 1 | demo mass at the answers, head mean |")
    )
    assert "| 1 -> 3 |" in line and ", ".join(cells) in line
    # layer 2's second visit runs at depth 4, deeper than any Baseline layer: no comparison
    line = next(
        x for x in text.splitlines() if x.startswith("| 2 | demo mass at the answers, head mean |")
    )
    assert line.endswith("| – | – | – |")
