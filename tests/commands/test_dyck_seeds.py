"""The seeds command on a Dyck pair: exact match by depth against an oracle whose right answers
are known word by word, the spread and rounding check of hand-made figures, and the command end
to end on dyck-pair-tiny (2 seeds and the rounding rerun, a few steps), headed by the command
and commit that wrote it, then reused without training."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from helpers.bad_input import assert_one_line_error, run_command

from smelt_interp.checkpoint import read_info
from smelt_interp.commands import dyck_seed_tables as figures
from smelt_interp.data.dyck import (
    DyckSpec,
    build_example,
    closing_sequence,
    make_dataset,
    nesting_depth,
)
from smelt_interp.data.dyck_draws import DRAW_SEED, TEST, VALIDATION, draw_words
from smelt_interp.data.tokenizer import ByteTokenizer
from smelt_interp.measure.intervals import t_interval, wilson_interval
from smelt_interp.measure.seeds import seed_summary
from smelt_interp.train.evaluate import heldout_dyck_examples
from smelt_interp.train.trainer import Trainer

MODULE = "smelt_interp.commands.seeds"
FAST = ["--preset", "dyck-pair-tiny", "--set", "steps=12", "--set", "ckpt_every=6"]
FAST += ["--set", "threads=2", "--n-words", "24", "--quiet"]
SPEC = DyckSpec(n_pairs=4, max_depth=20, min_len=2, max_len=60)


class ShallowOracle(torch.nn.Module):
    """Writes the reference closing sequence for queries nesting at most `deepest` deep and a
    wrong one ('>' and stop) for deeper ones: its exact match per word is known in advance.
    `asked` keeps every query it was given, in order."""

    def __init__(self, deepest: int) -> None:
        super().__init__()
        self.deepest = deepest
        self.cfg = SimpleNamespace(max_seq_len=1024)
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.tokenizer = ByteTokenizer()
        self.asked: list[str] = []

    def generate(self, tokens: torch.Tensor, max_new_tokens: int, temperature: float = 0.0):
        rows = []
        for row in tokens.tolist():
            query = self.tokenizer.decode(row[1:]).rsplit("Input: ", 1)[1].removesuffix(" Output: ")
            self.asked.append(query)
            right = nesting_depth(query) <= self.deepest
            answer = closing_sequence(query) if right else ">"
            new = list((answer + "\n").encode())[:max_new_tokens]
            rows.append(row + new + [ord("\n")] * (max_new_tokens - len(new)))
        return torch.tensor(rows)


def test_exact_match_by_depth_of_an_oracle():
    words = figures.heldout_words(60, SPEC)
    rows = {r["depth"]: r for r in figures.exact_match_rows(ShallowOracle(8), words)}
    depths = [nesting_depth(w.query) for w in words]
    shallow = sum(d <= 8 for d in depths)
    assert rows["all"]["n"] == 60 and rows["all"]["exact_match"] == pytest.approx(shallow / 60)
    assert (rows["all"]["lo"], rows["all"]["hi"]) == pytest.approx(wilson_interval(shallow, 60))
    assert rows["1-8"]["exact_match"] == 1.0 and rows["1-8"]["n"] == shallow
    assert rows["9-15"]["exact_match"] == 0.0 and rows["9-15"]["n"] == sum(
        9 <= d <= 15 for d in depths
    )
    assert sum(rows[r]["n"] for r in rows if r != "all") == 60
    assert figures.heldout_words(60, SPEC) == words  # the same words on every call


def test_the_dyck_branch_scores_the_test_draw_word_by_word(monkeypatch, make_cfg, make_model):
    """Every checkpoint the report scores is asked exactly the test draw's words, and its case
    study measures in-context prompts made of the same words (each query after 2 solved
    demonstrations, in the draw's order); none of them is in the validation draw (the seeds
    command's own at this size, or the trainer's), and the report names the draw."""
    from smelt_interp.commands import seed_report
    from smelt_interp.commands.seed_runs import run_configs
    from smelt_interp.train.build import build_config

    attends = make_model(make_cfg(max_seq_len=256))  # the oracles compute no attention
    measured: list[list[str]] = []
    chosen_on: list[set[str]] = []
    case_frames = seed_report.dyck_case_frames

    def case_study_of(model, prompts, selection):
        measured.append([(tuple(p for p, _ in w.demos), w.query) for w in prompts])
        chosen_on.append({q for w in selection for q in (*(p for p, _ in w.demos), w.query)})
        return case_frames(attends, prompts, selection)

    monkeypatch.setattr(seed_report, "dyck_case_frames", case_study_of)

    base = build_config("dyck-pair-tiny", None, ["threads=2", "dyck_eval_n=40"])
    spec = base.corpus.dyck.task_draw()
    oracles: list[ShallowOracle] = []

    def load(path):
        oracles.append(ShallowOracle(2))
        return oracles[-1], SimpleNamespace(meta={"tokens": 0})

    monkeypatch.setattr(seed_report, "load_checkpoint", load)
    monkeypatch.setattr(seed_report, "train_seconds", lambda folder, cfg: 1.0)
    runs = run_configs(base, 2, Path("unused"))
    payload, text = seed_report.dyck_report(runs, spec, base, 16, TEST)
    test = draw_words(TEST, 16, spec, apart_from=40)  # apart from the trainer's 40 words
    assert len(oracles) == 4 and all(sorted(o.asked) == sorted(test) for o in oracles)
    in_order = [tuple(test[i : i + 3]) for i in range(0, 15, 3)]  # 16 words: 5 groups of 3
    assert len(measured) == 4 and all(m == measured[0] for m in measured)
    assert measured[0] and all((*d, q) in in_order for d, q in measured[0])
    # the tracked heads are chosen on prompts of the other draw: no reported word among them
    assert len(chosen_on) == 4 and chosen_on[0] and not chosen_on[0] & set(test)
    assert chosen_on[0] <= set(draw_words(VALIDATION, 40, spec))
    assert "each prompt is a query after 2 solved demonstrations" in " ".join(text.split())
    assert not set(test) & set(draw_words(VALIDATION, 40, spec))
    trained_on = [ex.query for ex in heldout_dyck_examples(base, base.eval.dyck_n)]
    assert set(trained_on) <= set(draw_words(VALIDATION, 40, spec))
    assert payload["draw"] == TEST and payload["draw_apart_from"] == 40
    assert payload["words_seed"] == DRAW_SEED
    want = f"test draw: 16 words, seed {DRAW_SEED}, disjoint from the validation draw used to"
    assert want + " choose the recipe" in " ".join(text.split())
    _, text = seed_report.dyck_report(runs, spec, base, 16, VALIDATION)
    validation = sorted(draw_words(VALIDATION, 16, spec))
    assert len(oracles) == 8 and all(sorted(o.asked) == validation for o in oracles[4:])
    assert f"validation draw: 16 words, seed {DRAW_SEED}, the words the recipe" in text


def test_the_training_words_are_counted_by_depth_beside_the_task_draw():
    """The report says how deep the runs' own words nest: a hand count of the same draw."""
    deep = DyckSpec(n_pairs=4, max_depth=20, min_len=2, max_len=60, p_open=0.7)
    words = make_dataset(300, spec=deep, split="train", seed=figures.WORDS_SEED)
    depths = [nesting_depth(w.query) for w in words]
    by_hand = {"1-8": sum(d <= 8 for d in depths), "9-15": sum(9 <= d <= 15 for d in depths)}
    by_hand["16-24"] = sum(16 <= d <= 24 for d in depths)
    assert figures.depth_counts(words) == {k: n for k, n in by_hand.items() if n}
    line = figures.training_words_line(deep, 300)
    assert line.startswith("The runs' training words (p_open 0.7, deeper than the task), of 300")
    assert f"16-24: {by_hand['16-24']:,} ({100 * by_hand['16-24'] / 300:.1f}%)" in line
    task = figures.depth_counts(figures.heldout_words(300, deep))  # the task's draw
    assert by_hand["16-24"] > task.get("16-24", 0)
    assert "as the task draws them" in figures.training_words_line(SPEC, 10)
    shallow = DyckSpec(n_pairs=4, max_depth=20, min_len=2, max_len=60, p_open=0.4)
    assert "(p_open 0.4, shallower than the task)" in figures.training_words_line(shallow, 10)


def test_intervals_over_seeds_stay_within_a_hundred_percent():
    """Three seeds near 100%: the t interval runs past 100%, the seeds' bootstrap does not; two
    seeds give none, printed as a dash."""
    high = [1.0, 0.99, 0.90]
    assert t_interval(high)[2] > 1
    per_seed = _per_seed({(s, "baseline"): v for s, v in enumerate(high)})
    summary = figures.summarize(per_seed).iloc[0]
    assert 0.90 <= summary["exact_match_lo"] <= summary["exact_match_hi"] <= 1.0
    two = figures.summarize(per_seed[per_seed["seed"] < 2]).iloc[0]
    assert math.isnan(two["exact_match_lo"]) and math.isnan(two["exact_match_hi"])
    text = figures.markdown(per_seed[per_seed["seed"] < 2], _runs(), None, ["baseline"], SPEC, SPEC)
    assert "99.5% [–]; 99.5%; 99.0%-100.0%" in text


def _runs() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"seed": s, "model": "baseline", "role": "seed", "tokens": 10, "threads": 2}
            | {"train_seconds": 1.0}
            for s in (0, 1)
        ]
    )


def _per_seed(values: dict[tuple[int, str], float]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"seed": seed, "model": model, "depth": "all", "n": 100, "exact_match": v}
            | {"threads": 2, "lo": v - 0.05, "hi": v + 0.05}
            for (seed, model), v in values.items()
        ]
    )


def test_spread_and_rounding_check_of_hand_made_figures():
    per_seed = _per_seed({(0, "baseline"): 0.90, (1, "baseline"): 0.96, (2, "baseline"): 0.93})
    summary = figures.summarize(per_seed).iloc[0]
    mean = (0.90 + 0.96 + 0.93) / 3
    assert summary["exact_match"] == pytest.approx(mean)
    boot = seed_summary([0.90, 0.96, 0.93])  # the seeds' bootstrap, as every seeds table has
    assert (summary["exact_match_lo"], summary["exact_match_hi"]) == (boot.lo, boot.hi)
    assert summary["exact_match_median"] == 0.93
    assert (summary["min"], summary["max"]) == (0.90, 0.96) and summary["n_seeds"] == 3
    target = figures.targets(per_seed).iloc[0]  # mean 0.93 < 0.95; lowest 0.90 < 0.92
    assert target["mean"] == pytest.approx(mean) and not target["mean_met"]
    assert not target["floor_met"] and not target["met"]
    high = per_seed.assign(exact_match=[0.93, 0.99, 0.97])  # mean 0.963, lowest 0.93
    assert figures.targets(high).iloc[0][["mean_met", "floor_met", "met"]].tolist() == [True] * 3
    rounding = _per_seed({(0, "baseline"): 0.95}).assign(threads=1)
    check = figures.rounding_check(per_seed, rounding).iloc[0]
    assert check["difference"] == pytest.approx(0.05) and check["same_seed"] == 0.90
    assert check["within_spread"]
    outside = figures.rounding_check(per_seed, rounding.assign(exact_match=0.97)).iloc[0]
    assert not outside["within_spread"]
    # seed 0 rerun at 0.95 (gap 0.05, inside 0.90-0.96), seed 1 rerun at 0.97 (gap 0.01, outside);
    # the seeds lie 0.06, 0.03 and 0.03 apart
    reruns = _per_seed({(0, "baseline"): 0.95, (1, "baseline"): 0.97}).assign(threads=1)
    spread = figures.rounding_spread(per_seed, reruns).iloc[0]
    assert (spread["reruns"], spread["within_spread"]) == (2, 1)
    assert spread["rerun_gap"] == pytest.approx(0.03) and spread["seed_gap"] == pytest.approx(0.04)


def test_the_command_end_to_end_with_a_rounding_rerun(tmp_path, monkeypatch):
    out, results = tmp_path / "runs", tmp_path / "results" / "dyck.md"
    args = [*FAST, "--seeds", "2", "--rounding-threads", "1", "--rounding-seeds", "2"]
    args += ["--out", out, "--results", results]
    code, _, err = run_command(MODULE, *args)
    assert code == 0, err
    runs = [out / f"seed-{s}" / a for s in (0, 1) for a in ("baseline", "smelt")]
    reruns = [out / f"seed-{s}-threads-1" / a for s in (0, 1) for a in ("baseline", "smelt")]
    for run in runs + reruns:
        info = read_info(run / "ckpt.pt")
        assert info.final and info.step == 12
    assert {read_info(r / "ckpt.pt").train_config["threads"] for r in reruns} == {1}
    assert {read_info(r / "ckpt.pt").train_config["threads"] for r in runs} == {2}
    report = json.loads(results.with_suffix(".json").read_text())
    per_seed = pd.DataFrame(report["per_seed"])
    assert sorted(set(zip(per_seed["seed"], per_seed["model"]))) == [
        (0, "baseline"),
        (0, "smelt"),
        (1, "baseline"),
        (1, "smelt"),
    ]
    overall = per_seed[per_seed["depth"] == "all"]
    assert (overall["n"] == 24).all()
    over = pd.DataFrame(report["over_seeds"]).set_index(["model", "depth"])
    base = overall[overall["model"] == "baseline"]["exact_match"].tolist()
    assert over.loc[("baseline", "all"), "exact_match"] == pytest.approx(sum(base) / 2)
    assert {(r["seed"], r["model"]) for r in report["rounding"]} == {
        (s, a) for s in (0, 1) for a in ("baseline", "smelt")
    }
    spread = {r["model"]: r for r in report["rounding_spread"]}
    for model in ("baseline", "smelt"):
        seeds = overall[overall["model"] == model]["exact_match"].tolist()
        assert spread[model]["reruns"] == 2
        assert spread[model]["seed_gap"] == pytest.approx(abs(seeds[0] - seeds[1]))
    text = results.read_text()
    head = [line for line in text.splitlines()[:10] if line]
    assert head[0] == "# dyck-pair-tiny: 2 seeds"
    assert head[1].startswith("Command: `python -m smelt_interp.commands.seeds --preset dyck")
    assert head[2] == f"Commit: {report['commit']}"
    for table in ("by-depth", "seeds", "targets", "time", "rounding", "rounding-spread"):
        assert f"<!-- table: {table} -->" in text
    # the case study on the same words, every seed run (not the reruns), led by answer BOS
    case = report["case_study"]
    visits = pd.DataFrame(case["per_seed"]["by_visit"])
    assert sorted(set(zip(visits["seed"], visits["model"]))) == sorted(
        set(zip(overall["seed"], overall["model"]))
    )
    share = visits["demo_share"]  # in-context prompts: the demonstrations' answers are keys
    assert ((share > 0) & (share < 1)).all() and visits["demo_mean"].between(0, 1).all()
    assert ((visits["bos_uniform"] > 0) & (visits["bos_uniform"] < 1)).all()
    assert len(pd.DataFrame(case["per_seed"]["visit_pairs"])) == 2 * 2  # smelt's 2 looped layers
    over_visits = pd.DataFrame(case["over_seeds"]["by_visit"])
    assert over_visits["bos_mean_lo"].isna().all()  # 2 seeds: no interval
    assert "in-context prompts of the same words (test draw)" in text
    assert text.index("## Case study") < text.index("Answer positions (the prompts)")
    assert "The runs' training words (p_open 0.5, as the task draws them), of 24" in text
    assert report["draw"] == "test" and "test draw: 24 words, seed 2026" in text
    assert report["training_dyck"] == report["dyck"]  # dyck-pair-tiny trains on the task's draw
    stamps = {run: (run / "ckpt.pt").stat().st_mtime_ns for run in runs + reruns}

    def no_training(self):
        raise AssertionError(f"trained {self.out_dir} again")

    monkeypatch.setattr(Trainer, "run", no_training)
    code, stdout, err = run_command(MODULE, *args)
    assert code == 0, err
    assert stdout.count("complete, reused") == 8
    assert {run: (run / "ckpt.pt").stat().st_mtime_ns for run in runs + reruns} == stamps


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--preset", "dyck-pair-tiny", "--set", "threads=2", "--rounding-threads", "2"], "own"),
        (["--preset", "recall-pair-tiny", "--rounding-threads", "1"], "Dyck presets"),
        (["--preset", "recall-pair-tiny", "--draw", "validation"], "--draw is for Dyck presets"),
        (["--preset", "dyck-pair-tiny", "--draw", "train"], "invalid choice"),
        (["--preset", "dyck-pair-tiny", "--rounding-seeds", "2"], "needs --rounding-threads"),
        (
            ["--preset", "dyck-pair-tiny", "--seeds", "2"]
            + ["--rounding-threads", "1", "--rounding-seeds", "3"],
            "must lie in 1..--seeds (2)",
        ),
        (["--preset", "dyck-pair-tiny", "--results", "x.txt"], ".md"),
        (["--preset", "dyck-pair-tiny", "--n-words", "2"], "makes no case-study prompt"),
        (["--preset", "dyck-pair-tiny", "--results", "{plain}/r.md"], "is a file, not a folder"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, args, needle):
    plain = tmp_path / "plain"
    plain.write_text("keep me")
    args = [a.replace("{plain}", str(plain)) for a in args]
    code, _, err = run_command(MODULE, *args, "--out", tmp_path / "o")
    assert plain.read_text() == "keep me"
    assert_one_line_error(code, err, needle)
    assert not (tmp_path / "o").exists()


def test_the_rounding_rerun_trains_the_models_asked_for(tmp_path):
    from smelt_interp.commands.seed_runs import run_configs
    from smelt_interp.train.build import build_config

    base = build_config("dyck-pair-tiny", None, ["threads=2"])
    runs = run_configs(base, 2, tmp_path, rounding_threads=1, rounding_archs=("baseline",))
    roles = [(r.role, r.cfg.seed, r.cfg.arch, r.cfg.runtime.threads) for r in runs]
    assert roles == [
        ("seed", 0, "baseline", 2),
        ("seed", 0, "smelt", 2),
        ("seed", 1, "baseline", 2),
        ("seed", 1, "smelt", 2),
        ("rounding", 0, "baseline", 1),
    ]
    assert runs[-1].folder == tmp_path / "seed-0-threads-1" / "baseline"
    # the rerun is the seed-0 run but for its thread count
    assert runs[-1].cfg.with_overrides({"threads": 2}) == runs[0].cfg
    both = run_configs(base, 2, tmp_path, rounding_threads=1, rounding_seeds=2)
    reruns = [(r.folder.relative_to(tmp_path), r.cfg.seed) for r in both if r.role == "rounding"]
    assert reruns == [
        (Path("seed-0-threads-1/baseline"), 0),
        (Path("seed-0-threads-1/smelt"), 0),
        (Path("seed-1-threads-1/baseline"), 1),
        (Path("seed-1-threads-1/smelt"), 1),
    ]


def test_in_context_prompts_group_the_words_in_order_and_drop_what_does_not_fit():
    """Words taken 3 at a time in order (2 demonstrations, then the query), each prompt the
    build_example of the same words; a group longer than the context is left out, and the
    words after the last whole group are not used."""
    words = [build_example(q) for q in ["( (", "[", "{ { {", "< [ (", "(", "[ [ [ [", "{"]]
    first = build_example("{ { {", ["( (", "["])
    second = build_example("[ [ [ [", ["< [ (", "("])
    assert len(first.ids) != len(second.ids)
    assert figures.in_context_prompts(words, 10_000) == [first, second]
    shorter, longer = sorted([first, second], key=lambda p: len(p.ids))
    assert figures.in_context_prompts(words, len(longer.ids) - 1) == [shorter]
    assert figures.in_context_prompts(words, len(shorter.ids) - 1) == []
    assert figures.in_context_prompts(words, 10_000, n_demos=1)[0] == build_example("[", ["( ("])
