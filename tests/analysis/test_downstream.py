"""Downstream analysis: gains against hand computations, the bootstrap, the Dyck gap, the
command end to end on the trained tiny pair, and the ladder's runs table."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from smelt_interp.analysis.downstream import (
    DocumentScores,
    compare,
    document_losses,
    dyck_examples_for,
)
from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.errors import ConfigError, DataError
from smelt_interp.figures.downstream import dyck_by_demos, gain_bars
from smelt_interp.figures.theme import MODEL_COLORS
from smelt_interp.measure.intervals import bootstrap_interval
from smelt_interp.results import read_results
from smelt_interp.train.ladder import loss_table


def test_gain_by_domain_hand_computed():
    table = pd.DataFrame(
        {
            "domain": ["a", "a", "b"],
            "n_tokens": [10, 30, 5],
            "base_sum": [20.0, 60.0, 10.0],
            "smelt_sum": [18.0, 42.0, 11.0],
        }
    )
    gains = DocumentScores(table).gain_by("domain", n_boot=50).set_index("domain")
    # domain a: CE 80/40 = 2.0 vs 60/40 = 1.5 -> gain 25%; domain b: 2.0 vs 2.2 -> -10%
    assert gains.loc["a", "gain"] == pytest.approx(0.25)
    assert gains.loc["a", "ce_baseline"] == pytest.approx(2.0)
    assert gains.loc["b", "gain"] == pytest.approx(-0.10)
    assert gains.loc["a", "gain_lo"] <= 0.25 <= gains.loc["a", "gain_hi"]
    assert np.isnan(gains.loc["b", "gain_lo"])  # one document: no interval


def test_figures_use_the_models_colours():
    """Baseline and SMELT keep the colours of figures/theme.py, as on every other page."""
    demos = pd.DataFrame({"n_demos": [0, 1], "acc_baseline": [0.5, 0.6], "acc_smelt": [0.6, 0.9]})
    assert {t.name: t.line.color for t in dyck_by_demos(demos).data} == MODEL_COLORS
    gains = pd.DataFrame({"domain": ["a"], "gain": [0.1], "gain_lo": [0.0], "gain_hi": [0.2]})
    assert gain_bars(gains, "domain", "t").data[0].marker.color == MODEL_COLORS["smelt"]


def test_bootstrap_interval_of_a_mean():
    data = np.random.default_rng(0).normal(1.0, 1.0, 400)
    lo, hi = bootstrap_interval(lambda i: data[i].mean(), len(data), 400, seed=1)
    se = data.std() / np.sqrt(len(data))
    assert lo == pytest.approx(data.mean() - 1.96 * se, abs=0.3 * se)
    assert hi == pytest.approx(data.mean() + 1.96 * se, abs=0.3 * se)


def test_document_losses_match_a_per_row_reference(tiny_model, make_tokens):
    ids = make_tokens(3, 12, seed=3)
    lengths = torch.tensor([12, 7, 4])
    for r, n in enumerate(lengths):
        ids[r, n:] = PAD_ID
    sums, counts = document_losses(tiny_model, ids, lengths, batch_size=2)
    for r, n in enumerate(lengths.tolist()):
        row = ids[r : r + 1, :n]
        with torch.no_grad():
            logits = tiny_model(row)[0].double()
        ref = F.cross_entropy(logits[:-1], row[0, 1:], reduction="sum")
        assert counts[r] == n - 1
        assert sums[r] == pytest.approx(float(ref), rel=1e-4)


def test_dyck_examples_fit_the_model(make_cfg, make_model):
    model = make_model(make_cfg(max_seq_len=256))
    for k in (0, 1, 2, 4):
        examples = dyck_examples_for(model, k, 10, seed=k)
        assert len(examples) == 10
        assert all(len(ex.ids) < model.cfg.max_seq_len for ex in examples)
        assert all(ex.n_demos == k and ex.split == "heldout" for ex in examples)
    with pytest.raises(DataError, match="too short"):
        dyck_examples_for(make_model(make_cfg(max_seq_len=64)), 4, 10, seed=0)


def test_downstream_command_end_to_end(tiny_pair, tmp_path):
    out_json, out_html = tmp_path / "d.json", tmp_path / "d.html"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "smelt_interp.analysis.downstream",
            str(tiny_pair["baseline"]),
            str(tiny_pair["smelt"]),
            "--n-docs",
            "8",
            "--n-dyck",
            "16",
            "--bootstrap",
            "20",
            "--json",
            str(out_json),
            "--plot",
            str(out_html),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out_json.read_text())
    assert {r["domain"] for r in report["by_domain"]} == {"code", "arith", "dyck"}
    assert [r["n_demos"] for r in report["by_demos"]] == [0, 1, 2, 4]
    assert "plotly" in out_html.read_text()[:200_000].lower()
    assert "gain by domain" in proc.stdout


def test_downstream_bad_checkpoint_is_one_line(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    proc = subprocess.run(
        [sys.executable, "-m", "smelt_interp.analysis.downstream", str(bad), str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and str(bad) in proc.stderr


@pytest.mark.parametrize("n", ["1000000000000", "100001"])
def test_a_bootstrap_beyond_the_limit_is_refused_before_any_work(tmp_path, n):
    from helpers.bad_input import assert_one_line_error, run_command

    missing = tmp_path / "missing.pt"  # never opened: the refusal comes first
    code, _, err = run_command(
        "smelt_interp.analysis.downstream", missing, missing, "--bootstrap", n
    )
    assert_one_line_error(code, err, "--bootstrap", "at most 100,000", "iB")
    with pytest.raises(ConfigError, match="at most 100,000"):
        compare(None, None, n_boot=int(n))


def test_ladder_writes_a_runs_table(tmp_path):
    out = tmp_path / "ladder"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "smelt_interp.train",
            "ladder",
            "--sizes",
            "1",
            "--out",
            str(out),
            "--quiet",
            "--set",
            "steps=8",
            "--set",
            "branches=[4]",
            "--set",
            "warmup_steps=1",
            "--set",
            "eval_rows=2",
            "--set",
            "threads=1",
            "--results",
            str(tmp_path / "ladder.md"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = pd.read_csv(out / "runs.csv")
    results = read_results(tmp_path / "ladder.md")  # --results: the losses, with their command
    assert results.command.startswith("python -m smelt_interp.train ladder --sizes 1 --out")
    assert results.table("losses") == loss_table(runs)
    assert (tmp_path / "ladder.csv").read_text() == (out / "runs.csv").read_text()
    assert sorted(zip(runs["arch"], runs["steps"])) == [
        ("baseline", 4),
        ("baseline", 8),
        ("smelt", 4),
        ("smelt", 8),
    ]
    base, smelt = (runs[runs["arch"] == a].iloc[0] for a in ("baseline", "smelt"))
    assert abs(smelt["F"] / base["F"] - 1) < 0.04 and abs(smelt["N"] / base["N"] - 1) < 0.01
    assert (runs["D"] == runs["steps"] * 16 * 128).all()
    assert runs["loss"].between(0.5, 6.0).all()
    assert set(runs.columns) >= {"arch", "F", "S", "D", "loss"}
    _, first = load_checkpoint(out / "size0" / "baseline" / "branch-4" / "ckpt.pt")
    assert first.step == 4
