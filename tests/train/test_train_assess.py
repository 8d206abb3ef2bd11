"""`python -m smelt_interp.train eval`: the final report of trained checkpoints, checked against
a slow per-example greedy completion and a hand-computed Wilson interval."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from smelt_interp.checkpoint import load_checkpoint, save_checkpoint
from smelt_interp.data.dyck import build_example, make_dataset
from smelt_interp.measure.dyck_score import complete
from smelt_interp.measure.intervals import wilson_interval
from smelt_interp.train.assess import (
    REPORT_SEED_OFFSET,
    accuracy_by_depth,
    assess,
    format_report,
)
from smelt_interp.train.config import TrainConfig


def test_wilson_interval_matches_a_hand_computed_case():
    # 95 of 100: centre (0.95 + 1.96^2/200) / (1 + 1.96^2/100), worked by hand
    low, high = wilson_interval(95, 100)
    assert low == pytest.approx(0.88823, abs=1e-4)
    assert high == pytest.approx(0.97846, abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0


def test_exact_match_equals_a_per_example_greedy_loop(tiny_pair):
    report = assess(tiny_pair["smelt"], n_examples=24, loss_rows=4)
    model, info = load_checkpoint(tiny_pair["smelt"])
    cfg = TrainConfig.from_dict(info.train_config)
    examples = make_dataset(
        24, spec=cfg.corpus.dyck, split="heldout", seed=cfg.seed + REPORT_SEED_OFFSET
    )
    hits = sum(complete(model, ex.query) == ex.answer for ex in examples)
    assert report["dyck_exact_match"] == pytest.approx(hits / 24)
    assert report["dyck_n"] == 24 and report["arch"] == "smelt"
    assert set(k for k in report if k.startswith("loss/")) == {"loss/dyck", "loss/code"}
    assert all(0 < report[k] < 10 for k in ("loss/dyck", "loss/code"))


def test_accuracy_by_depth_on_a_hand_made_case():
    queries = ["(", "( [", " ".join("(" * 16), "( " * 10 + "(", "( " * 10 + "("]
    examples = [build_example(q) for q in queries]  # depths 1, 2, 16, 11, 11
    rows = accuracy_by_depth(examples, [True, False, True, True, True])
    assert [(r["depth"], r["n"], r["exact_match"]) for r in rows] == [
        ("1-8", 2, 0.5),
        ("9-15", 2, 1.0),
        ("16-24", 1, 1.0),
    ]
    assert rows[0]["ci95"] == pytest.approx(list(wilson_interval(1, 2)))
    report = {
        **{"arch": "baseline", "checkpoint": "c.pt", "step": 3, "dyck_exact_match": 0.8},
        **{"dyck_n": 5, "dyck_ci95": [0.4, 0.96], "dyck_max_depth": 30, "dyck_by_depth": rows},
    }
    text = format_report(report).splitlines()
    assert "80.0% of 5 held-out, depth <= 30 (95% CI 40.0%-96.0%)" in text[0]
    cells = [
        "1-8 50.0% (n 2, 9%-91%)",
        "9-15 100.0% (n 2, 34%-100%)",
        "16-24 100.0% (n 1, 21%-100%)",
    ]
    assert text[1] == "  by nesting depth: " + " | ".join(cells)


def test_per_depth_report_equals_a_per_example_greedy_loop(tiny_pair):
    report = assess(tiny_pair["baseline"], loss_rows=2, per_depth=12, seed=7)
    model, info = load_checkpoint(tiny_pair["baseline"])
    cfg = TrainConfig.from_dict(info.train_config)
    examples = make_dataset(12, spec=cfg.corpus.dyck, split="heldout", seed=7, by_depth=True)
    assert len(examples) == 12  # the tiny spec nests at most 3 deep: one range
    hits = [complete(model, ex.query) == ex.answer for ex in examples]
    assert report["dyck_sample"] == "12 per depth range" and report["dyck_n"] == 12
    assert report["dyck_exact_match"] == pytest.approx(sum(hits) / 12)
    assert report["dyck_by_depth"] == [
        {
            "depth": "1-8",
            "n": 12,
            "exact_match": sum(hits) / 12,
            "ci95": list(wilson_interval(sum(hits), 12)),
        }
    ]


def test_max_depth_draws_words_deeper_than_the_run_was_trained_on(tiny_pair):
    model, info = load_checkpoint(tiny_pair["smelt"])
    cfg = TrainConfig.from_dict(info.train_config)
    assert cfg.corpus.dyck.max_depth == 3
    report = assess(tiny_pair["smelt"], n_examples=40, seed=3, loss_rows=2, max_depth=4)
    spec = dataclasses.replace(cfg.corpus.dyck, max_depth=4)
    examples = make_dataset(40, spec=spec, split="heldout", seed=3)
    assert max(ex.depth for ex in examples) == 4
    hits = [complete(model, ex.query) == ex.answer for ex in examples]
    assert report["dyck_max_depth"] == 4
    assert report["dyck_exact_match"] == pytest.approx(sum(hits) / 40)


def test_command_prints_and_writes_json(tiny_pair, tmp_path):
    out = tmp_path / "eval.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "smelt_interp.train",
            "eval",
            str(tiny_pair["baseline"]),
            str(tiny_pair["smelt"]),
            "--n",
            "8",
            "--loss-rows",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["baseline", "by", "smelt", "by"]
    assert "of 8 held-out" in lines[0] and lines[1].startswith("  by nesting depth: 1-8 ")
    reports = json.loads(out.read_text())
    assert [r["arch"] for r in reports] == ["baseline", "smelt"]


def test_checkpoint_without_training_config_is_one_line_error(tiny_model, tmp_path):
    path = save_checkpoint(tmp_path / "bare.pt", tiny_model)
    proc = subprocess.run(
        [sys.executable, "-m", "smelt_interp.train", "eval", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no training config" in proc.stderr
    assert torch.load(path, weights_only=True)["format"] == "smelt-interp"  # left as it was


@pytest.mark.parametrize(
    "flags",
    [
        ["--n", "-1"],
        ["--loss-rows", "0"],
        ["--threads", "-2"],
        ["--per-depth", "0"],
        ["--max-depth", "0"],
        ["--bogus"],
    ],
)
def test_bad_flags_are_one_line_errors(tiny_model, tmp_path, flags):
    path = save_checkpoint(tmp_path / "bare.pt", tiny_model)
    proc = subprocess.run(
        [sys.executable, "-m", "smelt_interp.train", "eval", str(path), *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "error:" in proc.stderr
