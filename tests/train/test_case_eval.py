"""The trainer's periodic case-study evaluation (train.case_eval): its numbers equal the
case-study probe's point values on the same rows and model, a recall run records them at every
evaluation, and case_history reads them back as a long table."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.bad_input import run_command

from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_rows
from smelt_interp.measure import case_tables, group_masses
from smelt_interp.measure.case_accuracy import recall_accuracy
from smelt_interp.train.case_eval import CASE_ROWS, case_history, case_table, heldout_case

SPEC = AssocRecallSpec()


def probe_values(model, rows: torch.Tensor) -> dict[str, float]:
    """The eval record's keys from the probe's tables: non-answer BOS mass as it stands, the
    answer-position masses and accuracy pooled over n_demos >= 1 (weighted by positions, the
    accuracy table's n), first-occurrence accuracy from n_demos 0."""
    masses = group_masses.recall_masses(model, rows, SPEC.trigger_ids, batch_size=5, chunk=16)
    tables = case_tables.case_study(masses.groups(), model.schedule, n_resamples=10)
    non_answer = case_tables.non_answer_table(masses, model.schedule, n_resamples=10)
    acc = recall_accuracy(masses).set_index("n_demos")
    weight = acc["n"].drop(0)
    out = {}
    for r in non_answer.itertuples():
        out[f"case/bos_non_answer/{r.layer}.{r.visit}.{r.head}"] = r.bos_mass
    shown = tables["heads"][tables["heads"]["n_demos"] > 0]
    for (layer, visit, head), part in shown.groupby(["layer", "visit", "head"]):
        w = weight.loc[part["n_demos"]].to_numpy()
        for stat, col in (("demo_answer", "demo_mass"), ("bos_answer", "bos_mass")):
            out[f"case/{stat}/{layer}.{visit}.{head}"] = (part[col].to_numpy() * w).sum() / w.sum()
    out["case/answer_acc"] = (acc["accuracy"].drop(0) * weight).sum() / weight.sum()
    out["case/first_acc"] = acc.loc[0, "accuracy"]
    return out


@pytest.mark.parametrize("looped", [True, False], ids=["smelt", "baseline"])
def test_the_eval_record_is_the_probes_point_values(make_cfg, make_model, looped):
    model = make_model(make_cfg(looped=looped, init_std=0.4, max_seq_len=128), seed=4)
    rows = recall_rows(CASE_ROWS + 3, 96, seed=2, split="heldout", spec=SPEC)
    record = heldout_case(model, rows, SPEC)
    expected = probe_values(model, rows[:CASE_ROWS])  # the evaluation keeps CASE_ROWS rows
    n_per_head = len(model.schedule) * model.cfg.n_heads
    assert len(record) == 3 * n_per_head + 2
    assert record.keys() == expected.keys()
    for key, value in expected.items():
        # float32 sums in another order (batch split, thread count) move the 8th digit; a
        # wrong position or weight moves the 2nd
        assert record[key] == pytest.approx(value, abs=1e-6), key


def test_a_recall_run_records_the_case_study_and_its_history_reads_back(tmp_path):
    code, _, err = run_command(
        "smelt_interp.train",
        *("--preset", "recall-pair-tiny", "--arch", "smelt", "--out", tmp_path, "--quiet"),
        *("--set", "steps=20", "--set", "eval_every=10", "--set", "threads=1"),
    )
    assert code == 0, err
    run = tmp_path / "smelt"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("event") == "eval" and "branch" not in r]
    assert len(evals) >= 2
    model, info = load_checkpoint(run / "ckpt.pt")
    n_per_head = len(model.schedule) * model.cfg.n_heads
    assert all(sum(k.startswith("case/") for k in r) == 3 * n_per_head + 2 for r in evals)

    # the last record is the final model's, on the run's held-out rows
    length, trained = info.train_config["seq_len"], info.train_config["assoc_recall"]
    spec = AssocRecallSpec.from_mapping(trained)  # the run's own rows
    rows = recall_rows(CASE_ROWS, length, info.train_config["seed"], split="heldout", spec=spec)
    again = heldout_case(model.eval(), rows, spec)
    last = evals[-1]
    assert {k: last[k] for k in again} == pytest.approx(again, abs=1e-5)

    history = case_history(run / "metrics.jsonl")
    assert list(history.columns) == [
        "step",
        "tokens",
        "layer",
        "visit",
        "head",
        "statistic",
        "value",
    ]
    assert len(history) == len(evals) * (3 * n_per_head + 2)
    assert set(history["statistic"]) == {
        "bos_non_answer", "demo_answer", "bos_answer", "answer_acc", "first_acc"
    }  # fmt: skip
    demo = history.query("statistic == 'demo_answer' and layer == 1 and visit == 1 and head == 0")
    assert demo["value"].tolist() == [r["case/demo_answer/1.1.0"] for r in evals]
    assert demo["tokens"].tolist() == [r["tokens"] for r in evals]
    acc = history[history["statistic"] == "answer_acc"]
    assert acc["layer"].isna().all() and acc["value"].between(0, 1).all()


def test_case_table_keeps_only_main_run_eval_records():
    records = [
        {"event": "train", "step": 1, "case/answer_acc": 0.5},
        {"event": "eval", "step": 2, "tokens": 64, "case/answer_acc": 0.25, "loss/x": 1.0},
        {"event": "eval", "step": 2, "branch": 2, "case/answer_acc": 0.9},
        {"event": "eval", "step": 3, "tokens": 96, "case/bos_answer/0.0.1": 0.75,
         "case/bos_answer/x": 1.0, "case/other/0.0.0": 1.0},
        "not a record",
    ]  # fmt: skip
    table = case_table(records)
    assert table[["step", "statistic", "value"]].values.tolist() == [
        [2, "answer_acc", 0.25],
        [3, "bos_answer", 0.75],
    ]
    assert table.loc[1, ["layer", "visit", "head"]].tolist() == [0, 0, 1]
    assert case_history("/nonexistent/metrics.jsonl").empty
