"""`python -m smelt_interp.train eval`: the final report of trained checkpoints, checked against
a slow per-example greedy completion and a hand-computed Wilson interval."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from smelt_interp.checkpoint import load_checkpoint, save_checkpoint
from smelt_interp.data.dyck import make_dataset
from smelt_interp.data.dyck_eval import complete
from smelt_interp.train.assess import REPORT_SEED_OFFSET, assess, wilson_interval
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
    examples = make_dataset(24, split="heldout", seed=cfg.seed + REPORT_SEED_OFFSET, **cfg.dyck)
    hits = sum(complete(model, ex.query) == ex.answer for ex in examples)
    assert report["dyck_exact_match"] == pytest.approx(hits / 24)
    assert report["dyck_n"] == 24 and report["arch"] == "smelt"
    assert set(k for k in report if k.startswith("loss/")) == {"loss/dyck", "loss/code"}
    assert all(0 < report[k] < 10 for k in ("loss/dyck", "loss/code"))


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
    assert [line.split()[0] for line in lines] == ["baseline", "smelt"]
    assert "of 8 held-out" in lines[0]
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
    "flags", [["--n", "-1"], ["--loss-rows", "0"], ["--threads", "-2"], ["--bogus"]]
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
