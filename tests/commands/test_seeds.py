"""The seeds command: the t interval against a hand computation (kept for paired differences),
the per-seed figures of hand-made probe tables, visit pairs that follow one head across its
visits, the command end to end on recall-pair-tiny (2 seeds, a few steps: the case-study tables,
the control rows, no interval from 2 seeds) with a second invocation that reuses every run and
trains nothing, and bad input as one `error:` line with exit code 2."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from helpers.bad_input import assert_one_line_error, run_command

from smelt_interp.checkpoint import read_info
from smelt_interp.commands import case_seed_tables, recall_seed_tables
from smelt_interp.measure.intervals import t_interval
from smelt_interp.measure.seeds import over_seeds, seed_summary
from smelt_interp.probes.head_ablation import ablate_checkpoint
from smelt_interp.train.trainer import Trainer

MODULE = "smelt_interp.commands.seeds"
FAST = ["--preset", "recall-pair-tiny", "--set", "steps=12", "--set", "ckpt_every=6"]
FAST += ["--set", "eval_every=2"]  # 6 evaluations: the sink held over the last 5 is defined
FAST += ["--set", "threads=1", "--n-rows", "6", "--seq-len", "64", "--quiet"]


def test_t_interval_by_hand():
    # values 0.2, 0.4, 0.9: mean 0.5, sd sqrt(0.13), se sd / sqrt(3), t(0.975, 2) = 4.302653
    mean, lo, hi = t_interval([0.2, 0.4, 0.9])
    half = 4.302652729911275 * math.sqrt(0.13) / math.sqrt(3)
    assert mean == pytest.approx(0.5)
    assert (lo, hi) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    assert half == pytest.approx(0.895669, abs=1e-6)
    assert math.isnan(t_interval([0.3])[1]) and t_interval([0.3])[0] == 0.3
    frame = pd.DataFrame({"model": ["a", "a", "a", "b"], "x": [0.2, 0.4, 0.9, 1.0]})
    table = over_seeds(frame, ["model"], ["x"]).set_index("model")
    assert 0.2 <= table.loc["a", "x_lo"] < 0.5 < table.loc["a", "x_hi"] <= 0.9  # not the t's
    assert table.loc["a", "x_hi"] == seed_summary([0.2, 0.4, 0.9]).hi
    assert table.loc["a", "n_seeds"] == 3 and table.loc["b", "n_seeds"] == 1


def test_figures_of_hand_made_tables():
    """Two heads of one visit; answer positions with 1 demonstration (30 of them) and 2 (10):
    the pooled demo mass is their 3:1 weighted mean."""
    heads = pd.DataFrame(
        [
            {"n_demos": k, "layer": 0, "visit": 0, "head": h, "bos_mass": 0.0}
            | {f"demo_mass{s}": v + d for s, d in (("", 0), ("_lo", -0.1), ("_hi", 0.1))}
            for k, h, v in [(0, 0, 0.0), (1, 0, 0.4), (2, 0, 0.8), (1, 1, 0.1), (2, 1, 0.1)]
        ]
    )
    accuracy = pd.DataFrame(
        [
            {"n_demos": 0, "n": 20, "accuracy": 0.05, "lo": 0.0, "hi": 0.1, "kind": "next_token"},
            {"n_demos": 1, "n": 30, "accuracy": 0.9, "lo": 0.8, "hi": 1.0, "kind": "next_token"},
            {"n_demos": 2, "n": 10, "accuracy": 1.0, "lo": 1.0, "hi": 1.0, "kind": "next_token"},
        ]
    )
    non_answer = pd.DataFrame(
        [
            {"layer": 0, "visit": 0, "head": 0, "bos_mass": 0.6, "bos_mass_lo": 0.5}
            | {"bos_mass_hi": 0.7},
            {"layer": 0, "visit": 0, "head": 1, "bos_mass": 0.2, "bos_mass_lo": 0.1}
            | {"bos_mass_hi": 0.3},
        ]
    )
    tables = {"heads": heads, "accuracy": accuracy, "non_answer": non_answer}
    tables["sink"] = pd.DataFrame([{"sink03_gu": 0.5, "sink03_64": 0.0}])
    pooled = recall_seed_tables.answer_heads(tables).set_index("head")
    assert pooled.loc[0, "demo_mass"] == pytest.approx((30 * 0.4 + 10 * 0.8) / 40)
    assert pooled.loc[0, "demo_mass_lo"] == pytest.approx((30 * 0.3 + 10 * 0.7) / 40)
    assert pooled.loc[0, "bos_mass"] == 0.6 and pooled.loc[1, "bos_mass"] == 0.2
    ablation = pd.DataFrame(
        [
            {"run": "clean", "answer_acc": 0.9, "non_answer_loss": 1.0, "chance": 0.04},
            {"run": "retrieval head ablated", "layer": 0, "visit": 0, "head": 0}
            | {"answer_acc": 0.05, "non_answer_loss": 1.2, "chance": 0.04},
            {"run": "parked head ablated", "layer": 0, "visit": 0, "head": 0}
            | {"answer_acc": 0.9, "non_answer_loss": 1.01, "chance": 0.04},
            {"run": "retrieval heads ablated", "heads": "0.0.0 1.0.1"}
            | {"answer_acc": 0.03, "non_answer_loss": 1.3, "chance": 0.04},
        ]
    )
    fig = recall_seed_tables.model_figures(tables, pooled.reset_index(), ablation)
    assert fig["parked_head"] == "0.0.0"
    assert fig["answer_acc"] == pytest.approx((30 * 0.9 + 10 * 1.0) / 40)  # 0.925
    assert fig["first_acc"] == 0.05 and fig["acc_retrieval_ablated"] == 0.05
    assert fig["acc_retrieval_heads_ablated"] == 0.03 and fig["retrieval_heads"] == "0.0.0 1.0.1"
    assert fig["sink_target"] and fig["retrieval_target"] and fig["both_in_one_head"]
    tables["sink"] = pd.DataFrame([{"sink03_gu": 0.2, "sink03_64": 1.0}])  # Gu below 0.25: none
    fig = recall_seed_tables.model_figures(tables, pooled.reset_index(), ablation)
    assert not fig["sink_target"] and not fig["both_in_one_head"] and fig["retrieval_target"]
    # no head meets the sink definition: the parked run ablated nothing
    ablation.loc[2] = {"run": "parked head ablated", "note": "no head meets the sink definition"}
    fig = recall_seed_tables.model_figures(tables, pooled.reset_index(), ablation)
    assert fig["parked_head"] == "none" and math.isnan(fig["loss_parked_ablated"])
    # the sink held over training is the run log's, apart from the final checkpoint's
    assert not fig["sink_held"] and fig["held_head"] == "none"  # no log given
    for mass, met in ((0.6, True), (0.49, False), (math.nan, False)):
        held = ("2.0.0", mass)
        fig = recall_seed_tables.model_figures(tables, pooled.reset_index(), ablation, held)
        assert fig["sink_held"] == met and fig["held_head"] == "2.0.0"


def held_by_hand(run) -> tuple[str, float | None]:
    """The best head's lowest non-answer BOS over the run's last 5 evaluations, from its log;
    ("none", None) with fewer than 5 (NaN is null in strict JSON)."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("event") == "eval"][-5:]
    keys = [k for k in evals[-1] if k.startswith("case/bos_non_answer/")] if evals else []
    if len(evals) < 5 or not keys:
        return "none", None
    held = {k.rsplit("/", 1)[1]: min(e[k] for e in evals) for k in keys}
    best = max(held, key=held.get)
    return best, held[best]


def test_the_command_end_to_end_then_reuses_every_run(tmp_path, monkeypatch):
    out = tmp_path / "seeds"
    code, stdout, err = run_command(MODULE, *FAST, "--seeds", "2", "--out", out)
    assert code == 0, err
    runs = [out / f"seed-{s}" / arch for s in (0, 1) for arch in ("baseline", "smelt")]
    for run in runs:
        info = read_info(run / "ckpt.pt")
        assert info.final and info.step == 12
        assert info.train_config["seed"] == int(run.parent.name.split("-")[1])
    report = json.loads((out / "seeds.json").read_text())
    models = pd.DataFrame(report["per_seed"]["by_model"])
    assert sorted(zip(models["seed"], models["model"])) == [
        (0, "baseline"),
        (0, "smelt"),
        (1, "baseline"),
        (1, "smelt"),
    ]
    assert (models["tokens"] == 12 * 8 * 128).all()  # steps x batch x seq_len
    assert (models["train_seconds"] > 0).all()
    assert (models["held_head"] != "none").all()  # 6 evaluations a run: the held sink is defined
    for run, (_, model) in zip(runs, models.sort_values(["seed", "model"]).iterrows()):
        assert (model["held_head"], model["held_bos"]) == held_by_hand(run)
    # per seed, the clean accuracy is the head ablation's on the same held-out rows
    direct = ablate_checkpoint(runs[0] / "ckpt.pt", n_rows=6, seq_len=64).table
    assert models.iloc[0]["acc_clean"] == direct.iloc[0]["answer_acc"]
    # over seeds: mean, median and range of the per-seed values; no interval from 2 seeds
    over = pd.DataFrame(report["over_seeds"]["by_model"]).set_index("model")
    base = models[models["model"] == "baseline"]["loss_clean"].tolist()
    assert over.loc["baseline", "loss_clean"] == pytest.approx(sum(base) / 2)
    assert over.loc["baseline", "loss_clean_max"] == max(base)
    assert over.loc["baseline", "loss_clean_lo"] is None  # NaN in strict JSON
    visits = pd.DataFrame(report["per_seed"]["by_visit"])
    assert len(visits) == 2 * (4 + 6)  # the Baseline's 4 visits and SMELT's 6, per seed
    heads = visits.groupby("model")["n_heads"].agg(["min", "max"])
    assert (heads["min"] == heads["max"]).all()  # one head count per model
    control = pd.DataFrame(report["per_seed"]["control"])
    assert len(control) == len(visits) and (control["demo_share"] > 0).all()
    pairs = pd.DataFrame(report["per_seed"]["visit_pairs"])
    assert sorted(set(pairs["model"])) == ["smelt"] and len(pairs) == 2 * 2  # 2 looped layers
    split = pd.DataFrame(report["per_seed"]["non_answer"])
    masses = split[["bos_mass", "prev_mass", "self_mass", "rest_mass"]].sum(axis=1)
    assert masses.to_numpy() == pytest.approx(1.0, abs=1e-6)
    by_visit = pd.DataFrame(report["over_seeds"]["by_visit"])
    one = by_visit[(by_visit["model"] == "smelt") & (by_visit["layer"] == 1)].iloc[0]
    seeds = visits[(visits["model"] == "smelt") & (visits["layer"] == 1) & (visits["visit"] == 0)]
    assert one["bos_mean"] == pytest.approx(seeds["bos_mean"].mean())
    assert one["bos_mean_median"] == pytest.approx(seeds["bos_mean"].median())
    text = (out / "seeds.md").read_text()
    assert "held-out rows of stream 1" in report["tracked_head_chosen_on"]
    assert {"bos_same_head", "demo_same_head"} <= set(pairs.columns)  # the choice, saved
    assert "Seeds meeting each target, of 2" in text
    assert "Student-t" not in text and "Control rows (repeat_successor=False" in text
    differ = heads["min"].nunique() > 1
    assert ("Head counts differ" in text) == differ and ("Heads: " in text) == (not differ)
    first = text.index("Answer positions (held-out rows), the paper's quantity")
    assert first < text.index("Second view, the non-answer positions")
    stamps = {run: (run / "ckpt.pt").stat().st_mtime_ns for run in runs}

    def no_training(self):
        raise AssertionError(f"trained {self.out_dir} again")

    monkeypatch.setattr(Trainer, "run", no_training)
    code, stdout, err = run_command(MODULE, *FAST, "--seeds", "2", "--out", out)
    assert code == 0, err
    assert stdout.count("complete, reused") == 4
    assert {run: (run / "ckpt.pt").stat().st_mtime_ns for run in runs} == stamps
    assert json.loads((out / "seeds.json").read_text())["per_seed"] == report["per_seed"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--preset", "no-such-preset"], "unknown preset"),
        (["--seeds", "0"], ">= 1"),
        (["--set", "steps=-3"], "steps"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, args, needle):
    code, _, err = run_command(MODULE, *args, "--out", tmp_path / "o")
    assert_one_line_error(code, err, needle)
    assert not (tmp_path / "o").exists()


def test_an_out_that_is_a_file_or_holds_another_run_is_refused(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("keep me")
    code, _, err = run_command(MODULE, *FAST, "--seeds", "1", "--out", plain)
    assert_one_line_error(code, err, "a file, not a folder")
    assert plain.read_text() == "keep me"
    out = tmp_path / "seeds"
    assert run_command(MODULE, *FAST, "--seeds", "1", "--out", out)[0] == 0
    before = (out / "seed-0" / "baseline" / "ckpt.pt").read_bytes()
    code, _, err = run_command(MODULE, *FAST, "--set", "lr=0.001", "--seeds", "1", "--out", out)
    assert_one_line_error(code, err, "another training config")
    assert (out / "seed-0" / "baseline" / "ckpt.pt").read_bytes() == before
    # SMELT's pair rate set to the rate it already trained with: both runs are the same runs
    same_rate = ["--set", "arch_lr.smelt=0.01"]  # recall-pair-tiny's lr
    code, stdout, err = run_command(MODULE, *FAST, *same_rate, "--seeds", "1", "--out", out)
    assert code == 0, err
    assert stdout.count("complete, reused") == 2
    new_rate = ["--set", "arch_lr.smelt=0.005"]
    code, _, err = run_command(MODULE, *FAST, *new_rate, "--seeds", "1", "--out", out)
    assert_one_line_error(code, err, "smelt holds a run of another training config")
    assert (out / "seed-0" / "baseline" / "ckpt.pt").read_bytes() == before


def test_the_case_study_tables_pool_to_the_head_ablation_masses(tmp_path):
    """The case-study probe's tables the command reads, pooled over demonstration counts as the
    figures pool them (weighted by each count's answer positions), give the head ablation's
    masses over all answer positions of the same held-out rows."""
    import torch

    from smelt_interp.commands.seed_report import recall_inputs
    from smelt_interp.config import ModelConfig
    from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_positions
    from smelt_interp.model.transformer import SmeltModel
    from smelt_interp.probes import case_study
    from smelt_interp.probes.head_ablation import head_masses
    from smelt_interp.probes.registry import ProbeOptions

    torch.manual_seed(0)
    shape = {"d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 2, "d_head": 16}
    model = SmeltModel(ModelConfig.baseline(**shape, n_experts=2, top_k=1, d_expert=32)).eval()
    spec = AssocRecallSpec()
    inputs = recall_inputs(model, spec, 6, 80)
    tables = case_study.run(model, inputs, ProbeOptions())
    rows = inputs.recall_rows()
    positions = recall_positions(rows, spec.trigger_ids)
    pooled = recall_seed_tables.answer_heads(tables).sort_values(["layer", "visit", "head"])
    direct = head_masses(model, rows, spec.trigger_ids).sort_values(["layer", "visit", "head"])
    assert pooled["demo_mass"].to_numpy() == pytest.approx(direct["demo_mass"].to_numpy())
    assert pooled["bos_mass"].to_numpy() == pytest.approx(direct["bos_mass"].to_numpy())
    assert (pooled["demo_mass_lo"] <= pooled["demo_mass"]).all()
    assert (pooled["demo_mass"] <= pooled["demo_mass_hi"]).all()
    acc = tables["accuracy"]
    assert acc["n"].sum() == int(positions.answer.sum() + positions.first.sum())


def _pairs(head_0: tuple[float, float], head_1: tuple[float, float]) -> pd.DataFrame:
    """A hand-made `visit_pairs` table of one looped layer, two heads, every statistic alike."""
    rows = []
    for stat in ("bos_mass", "demo_mass", "na_bos_mass"):
        for head, (v0, v1) in (("0", head_0), ("1", head_1)):
            rows.append({"layer": 1, "head": head, "statistic": stat, "visit_0": v0})
            rows[-1] |= {"visit_1": v1, "diff": v1 - v0, "lo": v1 - v0 - 0.1, "hi": v1 - v0 + 0.1}
        mean_0, mean_1 = (head_0[0] + head_1[0]) / 2, (head_0[1] + head_1[1]) / 2
        rows.append({"layer": 1, "head": "mean", "statistic": stat, "visit_0": mean_0})
        rows[-1] |= {"visit_1": mean_1, "diff": mean_1 - mean_0, "lo": 0.0, "hi": 0.0}
    return pd.DataFrame(rows)


CHOSE_HEAD_0 = {(1, stat): 0 for stat in ("bos_mass", "demo_mass", "na_bos_mass")}


def test_visit_pairs_follow_one_head_across_its_visits():
    """Head 0 holds 0.6 at visit 0 and 0.1 at visit 1, head 1 0.2 then 0.7: best heads of each
    visit would pair 0.7 with 0.6 (+0.1); the same head, the best at visit 0, falls by 0.5."""
    tables = {"visit_pairs": _pairs((0.6, 0.1), (0.2, 0.7))}
    figures = case_seed_tables.pair_figures(tables, case_seed_tables.choose_heads(tables))
    row = figures.iloc[0]
    assert row["bos_same"] == pytest.approx(-0.5) and row["bos_same_head"] == 0
    assert (row["bos_same_lo"], row["bos_same_hi"]) == pytest.approx((-0.6, -0.4))
    assert row["demo_mean"] == pytest.approx(0.0)  # the head mean moves by (−0.5 + 0.5) / 2
    per_seed = pd.concat(
        [
            case_seed_tables.pair_figures({"visit_pairs": _pairs(h0, h1)}, CHOSE_HEAD_0).assign(
                seed=s
            )
            for s, (h0, h1) in enumerate(
                [((0.6, 0.1), (0.2, 0.7)), ((0.5, 0.3), (0.1, 0.1)), ((0.9, 0.2), (0.0, 0.4))]
            )
        ]
    ).assign(model="smelt")
    diff = over_seeds(per_seed, ["model", "layer"], case_seed_tables.PAIR_STATS).iloc[0]
    assert diff["bos_same"] == pytest.approx((-0.5 - 0.2 - 0.7) / 3)
    summary = seed_summary([-0.5, -0.2, -0.7])
    assert (diff["bos_same_lo"], diff["bos_same_hi"]) == (summary.lo, summary.hi)
    assert diff["bos_same_lo"] <= diff["bos_same"] <= diff["bos_same_hi"] < 0
