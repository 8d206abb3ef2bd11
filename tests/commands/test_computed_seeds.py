"""The computed-recall seeds command (commands.computed_seeds) and its arithmetic
(measure.computed_criteria, commands.computed_seed_tables): the command end to end on
computed-recall-tiny (1 seed x 3 runs, a few steps, 8 rows: the runs, every criterion column in
the JSON and the Markdown, figures equal to the measures called directly on the same rows), a
second invocation that reuses every run and labels a validation run; the criteria judged on a
hand-built table of planted seed values (one seed meeting all, one failing each check alone, the
thresholds' edges) and the verdict over seeds; the matched-depth difference in differences
against a hand computation; the refusal of validation seeds without --validation; and bad input
as one `error:` line with exit code 2."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from helpers.bad_input import assert_one_line_error, run_command

from smelt_interp.checkpoint import load_checkpoint, read_info
from smelt_interp.commands import computed_seed_tables as tables
from smelt_interp.commands.computed_seeds import REPO, parse_seeds
from smelt_interp.measure import computed_criteria as cc
from smelt_interp.measure.case_accuracy import computed_accuracy
from smelt_interp.probes.computed_inputs import heldout_rows
from smelt_interp.probes.computed_recall import tracked_head
from smelt_interp.provenance import Provenance
from smelt_interp.results import read_results
from smelt_interp.train.trainer import Trainer

MODULE = "smelt_interp.commands.computed_seeds"
STEPS = 4
FAST = ["--preset", "computed-recall-tiny", "--set", f"steps={STEPS}", "--set", "ckpt_every=2"]
FAST += ["--set", "eval_every=2", "--rows", "8", "--quiet"]
ROWS = 8


# ----- the command end to end ----------------------------------------------------------------
def test_the_command_trains_one_seed_of_three_runs_and_writes_every_criterion(
    tmp_path, monkeypatch
):
    out, md = tmp_path / "runs", tmp_path / "results" / "computed.md"
    code, stdout, err = run_command(MODULE, *FAST, "--seeds", "5", "--out", out, "--results", md)
    assert code == 0, err
    runs = {role: out / "seed-5" / role for role in tables.RUNS}
    for role, run in runs.items():
        info = read_info(run / "ckpt.pt")
        assert info.final and info.step == STEPS and info.train_config["seed"] == 5
        key = info.train_config["computed_recall"]["key"]
        assert key == ("shallow" if role == tables.SHALLOW else "deep")
        assert info.train_config["arch"] == ("baseline" if role == tables.BASELINE else "smelt")
    report = json.loads(md.with_suffix(".json").read_text())
    per_seed = pd.DataFrame(report["per_seed"])
    assert per_seed["seed"].tolist() == [5]
    columns = [c.column for c in cc.CHECKS] + list(cc.CRITERION_COLUMNS) + [cc.ALL_MET]
    assert set(columns) | set(cc.JUDGED) <= set(per_seed.columns)
    assert report["verdict"]["preregistered"] is False and report["verdict"]["success"] is None
    assert report["verdict"]["reasons"] == ["seeds 5, not the test seeds 5-9", "8 rows, not 512"]
    assert report["validation_run"] is False
    assert report["thresholds"]["ACCURACY_MIN"] == cc.ACCURACY_MIN
    per_run = pd.DataFrame(report["per_run"]).set_index("run")
    assert sorted(per_run.index) == sorted(tables.RUNS)
    assert (per_run["row_len"] == 66).all()  # the preset's seq_len: 10 demonstrations and query
    # the judged figures are the measures called directly on the namespaces' rows
    model, info = load_checkpoint(runs[tables.SMELT] / "ckpt.pt")
    spec = Provenance.of(info).computed_spec
    test = heldout_rows(model, ROWS, 66, 5, "test", spec)
    validation = heldout_rows(model, ROWS, 66, 5, "validation", spec)
    direct = computed_accuracy(model, test, spec)
    assert per_seed.loc[0, "answer_acc"] == direct["answer_accuracy"]
    masses = tracked_head(model, validation, test, spec)["masses"].set_index("visit")
    assert per_seed.loc[0, "bos_v0"] == pytest.approx(masses.loc[0, "bos_mass"])
    assert per_seed.loc[0, "demo_v1"] == pytest.approx(masses.loc[1, "demo_mass"])
    shallow = per_run.loc[tables.SHALLOW]
    assert per_seed.loc[0, "shallow_demo_v0"] == shallow["demo_v0"]
    bos = per_seed.loc[0, "bos_v0"] - per_seed.loc[0, "bos_v1"]
    assert report["sign_test"]["diffs"] == [pytest.approx(bos)]
    did = pd.DataFrame(report["did"])
    assert sorted(zip(did["kind"], did["statistic"])) == sorted(
        (k, s) for k in tables.DID_KINDS for s in tables.STATS
    )
    # the Markdown: header lines, every check's wording, the verdict and the sections
    text = md.read_text()
    parsed = read_results(md)
    assert parsed.command.startswith(f"python -m {MODULE} --preset computed-recall-tiny")
    assert "criteria" in parsed.tables
    for check in cc.CHECKS:
        assert f"{check.criterion}: {check.text}" in parsed.tables["criteria"]
    for n in cc.CRITERIA:
        assert f"| criterion {n} |" in parsed.tables["criteria"]
    assert "No verdict: not the pre-registered test" in text and "Validation run" not in text
    assert "Matched depth: SMELT's (layer L, visit v) runs at depth index d" in text
    assert "head mean over the loop span" in text and "0.0625 at 5 seeds" in text
    assert "wrote" in stdout and "seed 5: criteria 1" in stdout

    # again, as a validation run: every run reused, the output labelled
    def no_training(self):
        raise AssertionError(f"trained {self.out_dir} again")

    monkeypatch.setattr(Trainer, "run", no_training)
    again = tmp_path / "validation.md"
    args = [*FAST, "--seeds", "5", "--validation", "--out", out, "--results", again]
    code, stdout, err = run_command(MODULE, *args)
    assert code == 0, err
    assert stdout.count("complete, reused") == 3
    assert "(validation run)" in again.read_text().splitlines()[0]
    assert "**Validation run**" in again.read_text()
    relabelled = json.loads(again.with_suffix(".json").read_text())
    assert relabelled["validation_run"] is True
    assert relabelled["verdict"]["reasons"][0] == "a validation run"
    assert relabelled["per_seed"] == report["per_seed"]


def test_validation_seeds_are_refused_without_the_flag(tmp_path):
    out, md = tmp_path / "runs", tmp_path / "computed.md"
    for seeds in ("0-4", "4-6", "3"):
        code, _, err = run_command(MODULE, *FAST, "--seeds", seeds, "--out", out, "--results", md)
        assert_one_line_error(code, err, "validation seeds", "--validation")
    assert not out.exists() and not md.exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--preset", "no-such-preset", "--seeds", "5"], "unknown preset"),
        (["--preset", "recall-pair-tiny", "--seeds", "5"], "does not train computed_recall"),
        (["--preset", "computed-recall-tiny", "--seeds", "9-5"], "--seeds"),
        (["--preset", "computed-recall-tiny", "--seeds", "five"], "--seeds"),
        (["--preset", "computed-recall-tiny", "--seeds", "5,5"], "repeated"),
        (["--preset", "computed-recall-tiny", "--seeds", "5-2000"], "more than 1,000"),
        (["--preset", "computed-recall-tiny"], "--seeds"),
        (
            [
                "--preset",
                "computed-recall-tiny",
                "--seeds",
                "5",
                "--set",
                "computed_recall.key=shallow",
            ],
            "deep key",
        ),
        (["--preset", "computed-recall-tiny", "--seeds", "5", "--rows", "0"], ">= 1"),
        (["--preset", "computed-recall-tiny", "--seeds", "5", "--set", "seq_len=8"], "length"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, args, needle):
    code, _, err = run_command(MODULE, *args, "--out", tmp_path / "o")
    assert_one_line_error(code, err, needle)
    assert not (tmp_path / "o").exists()


def test_the_criteria_file_and_a_non_markdown_results_are_refused(tmp_path):
    base = ["--preset", "computed-recall-tiny", "--seeds", "5", "--out", tmp_path / "o"]
    code, _, err = run_command(MODULE, *base, "--results", REPO / cc.CRITERIA_FILE)
    assert_one_line_error(code, err, "pre-registered criteria file")
    code, _, err = run_command(MODULE, *base, "--results", tmp_path / "out.txt")
    assert_one_line_error(code, err, ".md")
    assert not (tmp_path / "o").exists()


def test_seeds_parse_as_ranges_and_lists():
    assert parse_seeds("5-9") == [5, 6, 7, 8, 9]
    assert parse_seeds("9,5-6") == [5, 6, 9]
    assert parse_seeds("7") == [7]
    assert cc.seed_text([5, 6, 7, 9]) == "5-7, 9"


# ----- judging planted seed values -----------------------------------------------------------
MEETS_ALL = {
    "answer_acc": 0.95,
    "shuffled_acc": 0.25,
    "probe_v0_acc": 0.30,
    "probe_v0_control": 0.26,
    "probe_v1_acc": 0.90,
    "bos_v0": 0.70,
    "demo_v1": 0.60,
    "bos_v1": 0.05,
    "shallow_demo_v0": 0.65,
}
# one planted value per check that fails it alone (the probe at visit 0: above 0.40 and above
# its control + 0.10)
FAILS = {
    "c1_accuracy": {"answer_acc": 0.89},
    "c1_shuffled": {"shuffled_acc": 0.31},
    "c2_probe_v0": {"probe_v0_acc": 0.41, "probe_v0_control": 0.30},
    "c2_probe_v1": {"probe_v1_acc": 0.79},
    "c3_bos_v0": {"bos_v0": 0.49},
    "c3_demo_v1": {"demo_v1": 0.49},
    "c3_bos_v1": {"bos_v1": 0.11},
    "c4_shallow_demo_v0": {"shallow_demo_v0": 0.49},
}


def planted(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{"seed": 100 + i, **MEETS_ALL, **r} for i, r in enumerate(rows)])


def test_a_seed_meeting_all_and_one_failing_each_check_are_judged_right():
    assert set(FAILS) == {c.column for c in cc.CHECKS}
    judged = cc.judge(planted([{}, *FAILS.values()]))
    first = judged.iloc[0]
    assert all(first[c.column] for c in cc.CHECKS) and first[cc.ALL_MET]
    criterion_of = {c.column: c.criterion for c in cc.CHECKS}
    for (failing, _), (_, row) in zip(FAILS.items(), judged.iloc[1:].iterrows()):
        for check in cc.CHECKS:
            assert row[check.column] == (check.column != failing), (failing, check.column)
        for n, column in zip(cc.CRITERIA, cc.CRITERION_COLUMNS):
            assert row[column] == (n != criterion_of[failing]), (failing, column)
        assert not row[cc.ALL_MET]


def test_the_thresholds_edges():
    edges = [
        {"answer_acc": 0.90, "shuffled_acc": 0.30, "probe_v1_acc": 0.80},  # at least / at most
        {"bos_v0": 0.5, "demo_v1": 0.5, "bos_v1": 0.1, "shallow_demo_v0": 0.5},
        {"probe_v0_acc": 0.40, "probe_v0_control": 0.0},  # at most 0.40
        {"probe_v0_acc": 0.45, "probe_v0_control": 0.35},  # 0.45 <= 0.35 + 0.10 (not in floats)
        {"probe_v0_acc": 0.45, "probe_v0_control": 0.34},  # above both: fails
        {"answer_acc": math.nan},  # a value that could not be measured meets nothing
        {"probe_v0_acc": 0.2, "probe_v0_control": math.nan},  # <= 0.40 alone suffices
    ]
    judged = cc.judge(planted(edges))
    assert judged[cc.ALL_MET].tolist() == [True, True, True, True, False, False, True]
    assert not judged.iloc[4]["c2_probe_v0"] and not judged.iloc[5]["c1_accuracy"]


def test_the_verdict_over_seeds():
    seeds = list(cc.TEST_SEEDS)
    four = cc.judge(planted([{}, {}, {}, {}, FAILS["c3_bos_v1"]]))
    three = cc.judge(planted([{}, {}, {}, FAILS["c1_accuracy"], FAILS["c4_shallow_demo_v0"]]))
    success = cc.verdict(four, seeds, cc.TEST_ROWS)
    assert success.preregistered and success.success and success.n_met == 4
    assert success.text.startswith("Success: 4 of 5 seeds")
    failure = cc.verdict(three, seeds, cc.TEST_ROWS)
    assert failure.preregistered and failure.success is False and failure.n_met == 3
    assert failure.text.startswith("Not met: 3 of 5 seeds")
    for other, reason in (
        (cc.verdict(four, seeds, cc.TEST_ROWS, validation=True), "a validation run"),
        (cc.verdict(four, [0, 1, 2, 3, 4], cc.TEST_ROWS), "seeds 0-4, not the test seeds 5-9"),
        (cc.verdict(four, seeds, 64), "64 rows, not 512"),
    ):
        assert not other.preregistered and other.success is None
        assert reason in other.reasons and "would read: met" in other.text


def test_the_sign_test_over_seeds_and_its_floor():
    judged = planted([{"bos_v0": 0.6, "bos_v1": b} for b in (0.1, 0.2, 0.0, 0.3, 0.05)])
    test = cc.bos_sign_test(judged)
    assert (test.positive, test.negative) == (5, 0)
    assert test.p_value == pytest.approx(0.0625) and test.floor == pytest.approx(0.0625)
    mixed = cc.bos_sign_test(planted([{"bos_v0": 0.1, "bos_v1": 0.2}, {}, {}]))
    assert (mixed.positive, mixed.negative) == (2, 1) and mixed.p_value == pytest.approx(1.0)


# ----- the difference in differences at matched depth -----------------------------------------
SCHEDULE = [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (3, 0)]  # SMELT: layers 1-2 twice


def test_the_difference_in_differences_against_a_hand_computation():
    smelt = {(0, 0): 0.1, (1, 0): 0.6, (2, 0): 0.5, (1, 1): 0.05, (2, 1): 0.2, (3, 0): 0.3}
    baseline = {0: 0.1, 1: 0.4, 2: 0.35, 3: 0.3, 4: 0.2, 5: 0.1}  # layer l at depth l
    rec = cc.matched_depth_did(smelt, SCHEDULE, baseline, layer=1)
    # layer 1: visit 0 at depth 1, visit 1 at depth 3; Baseline layers 1 and 3
    assert (rec["d0"], rec["d1"]) == (1, 3)
    assert rec["smelt_change"] == pytest.approx(0.05 - 0.6)
    assert rec["baseline_change"] == pytest.approx(0.3 - 0.4)
    assert rec["did"] == pytest.approx((0.05 - 0.6) - (0.3 - 0.4))  # -0.45
    rec = cc.matched_depth_did(smelt, SCHEDULE, baseline, layer=2)
    assert (rec["d0"], rec["d1"]) == (2, 4)
    assert rec["did"] == pytest.approx((0.2 - 0.5) - (0.2 - 0.35))  # -0.15
    short = {k: v for k, v in baseline.items() if k < 4}  # a 4-layer Baseline: no depth 4
    assert math.isnan(cc.matched_depth_did(smelt, SCHEDULE, short, layer=2)["did"])


def test_the_seed_difference_in_differences_reads_own_heads_and_head_means():
    """did_records on hand-made layers frames: the tracked kind reads each matched layer's own
    head, the mean kind the head means."""
    rows = []
    for depth, (layer, visit) in enumerate(SCHEDULE):
        rows.append(
            {"run": tables.SMELT, "layer": layer, "visit": visit, "depth": depth}
            | {"bos_head": 0.1 * depth, "demo_head": 0.2, "bos_mean": 0.05 * depth}
            | {"demo_mean": 0.1}
        )
    for layer in range(6):
        rows.append(
            {"run": tables.BASELINE, "layer": layer, "visit": 0, "depth": layer}
            | {"bos_head": 0.02 * layer, "demo_head": 0.3 + 0.01 * layer}
            | {"bos_mean": 0.01 * layer, "demo_mean": 0.1}
        )
    did = pd.DataFrame(tables.did_records(7, pd.DataFrame(rows), tracked_layer=1))
    by = did.set_index(["kind", "statistic"])["did"]
    # layer 1: depths 1 and 3
    assert by["tracked", "bos"] == pytest.approx((0.3 - 0.1) - (0.06 - 0.02))
    assert by["tracked", "demo"] == pytest.approx(0.0 - (0.33 - 0.31))
    assert by["mean", "bos"] == pytest.approx((0.15 - 0.05) - (0.03 - 0.01))
    assert by["mean", "demo"] == pytest.approx(0.0)
    assert (did["seed"] == 7).all() and set(did["d1"]) == {3}
