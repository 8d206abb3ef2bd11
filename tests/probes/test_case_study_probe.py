"""The case-study probe on models: its masses for both tasks equal a float64 brute force from
each visit's `hook_pattern` (a slow loop over rows, positions and keys), per (layer, visit,
head), for a looped SMELT model and a Baseline: per demonstration count, at the non-answer
positions (BOS, prev, self, rest, entropy), and pooled over the answer positions with
demonstrations as head means, best heads, chance levels and same-head visit pairs;
bos + demo + prev + self + rest is 1 at every answer position; the Dyck masses are those of the
per-prompt key-set formulation it replaced; and the command runs on a tiny trained checkpoint
for both tasks, with a wrong --task refused in one line."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from helpers.bad_input import assert_one_line_error, run_command
from helpers.recall_scan import scan

from smelt_interp.data.assoc_recall import AssocRecallSpec
from smelt_interp.data.dyck import dyck_batch
from smelt_interp.measure import case_tables, group_masses
from smelt_interp.measure.batching import capture
from smelt_interp.measure.case_positions import MAX_DEMOS, recall_case
from smelt_interp.measure.dyck_score import answer_positions
from smelt_interp.measure.position_mass import grouped_mass, key_set_mass, qk_hook_names, qk_rows
from smelt_interp.model.protocol import hook_name
from smelt_interp.probes import case_study
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.metrics import span_mask
from smelt_interp.probes.registry import ProbeOptions

ATOL = 1e-5
OPTS = ProbeOptions(batch_size=2, chunk=5)  # several micro-batches and query chunks
SPEC = AssocRecallSpec()


def patterns(model, tokens: torch.Tensor) -> dict[tuple[int, int], np.ndarray]:
    """Each visit's attention pattern [b, H, T, T] in float64, from run_with_cache."""
    names = model.hook_names("attn.hook_pattern")
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    return {
        lv: cache[hook_name(*lv, "attn.hook_pattern")].double().numpy() for lv in model.schedule
    }


def add_query(acc: dict, key, p: np.ndarray, q: int, demo: set[int]) -> None:
    """Add one query's statistics (per head: bos, demo, prev, self, rest, entropy), looping
    over its keys one at a time, to acc[key], with uniform attention's (1 / (q + 1) a key),
    and count it."""
    stats = np.zeros((p.shape[0], 6))
    chance = np.zeros(6)
    prev = q - 1 if q - 1 >= 1 and q - 1 not in demo else None
    for k in range(q + 1):
        which = 0 if k == 0 else 1 if k in demo else 2 if k == prev else 3 if k == q else 4
        for head in range(p.shape[0]):
            w = float(p[head, q, k])
            stats[head, which] += w
            stats[head, 5] -= w * math.log(w) if w > 0 else 0.0
        chance[which] += 1 / (q + 1)
    chance[5] = math.log(q + 1)
    total, ref, n = acc.get(key, (0.0, 0.0, 0))
    acc[key] = (total + stats, ref + chance, n + 1)


def pooled(acc: dict, groups, layer: int, visit: int) -> tuple[np.ndarray, np.ndarray]:
    """The brute-force means [H, 6] over the positions of `groups` at one visit, and uniform
    attention's [6]."""
    parts = [acc[g, layer, visit] for g in groups if (g, layer, visit) in acc]
    n = sum(part[2] for part in parts)
    return sum(part[0] for part in parts) / n, sum(part[1] for part in parts) / n


def check_answer_tables(tables, acc: dict, model, shown) -> None:
    """The probe's `answer` table (head means, best heads, chance levels) and `visit_pairs`
    (the same head at both visits, and the head mean) equal the brute force pooled over the
    answer groups `shown`."""
    answer = tables["answer"].set_index(["layer", "visit"])
    for layer, visit in model.schedule:
        mean, chance = pooled(acc, shown, layer, visit)
        non, non_chance = pooled(acc, ["non_answer"], layer, visit)
        r = answer.loc[(layer, visit)]
        assert r["n_heads"] == model.cfg.n_heads
        for name, m, s in (("bos", mean, 0), ("demo", mean, 1), ("na_bos", non, 0)):
            assert r[f"{name}_mean"] == pytest.approx(m[:, s].mean(), abs=ATOL)
            assert r[f"{name}_best"] == pytest.approx(m[:, s].max(), abs=ATOL)
            assert r[f"{name}_best_head"] == int(np.argmax(m[:, s]))
            assert r[f"{name}_mean_lo"] - 1e-9 <= r[f"{name}_mean"] <= r[f"{name}_mean_hi"] + 1e-9
        assert r["bos_uniform"] == pytest.approx(chance[0], abs=1e-12)
        assert r["demo_share"] == pytest.approx(chance[1], abs=1e-12)
        assert r["na_bos_uniform"] == pytest.approx(non_chance[0], abs=1e-12)
    pairs = tables["visit_pairs"]
    looped = sorted({layer for layer, visit in model.schedule if visit == 1})
    assert sorted(set(pairs["layer"])) == looped
    for layer in looped:
        (m0, _), (m1, _) = pooled(acc, shown, layer, 0), pooled(acc, shown, layer, 1)
        for head in [*range(model.cfg.n_heads), case_tables.MEAN_HEAD]:
            for stat, s in (("bos_mass", 0), ("demo_mass", 1)):
                r = pairs.query(f"layer == {layer} and head == '{head}' and statistic == '{stat}'")
                h = slice(None) if head == case_tables.MEAN_HEAD else head
                want = np.mean(m1[h, s]) - np.mean(m0[h, s])
                assert float(r["diff"].iloc[0]) == pytest.approx(want, abs=ATOL)
                assert float(r["visit_0"].iloc[0]) == pytest.approx(np.mean(m0[h, s]), abs=ATOL)


def check_tables(tables, acc: dict, model) -> None:
    """The probe's heads and non_answer tables equal the brute-force means in `acc`."""
    heads, non_answer = tables["heads"], tables["non_answer"]
    seen = 0
    for (group, layer, visit), (total, ref, n) in acc.items():
        mean = total / n
        for head in range(model.cfg.n_heads):
            if group == "non_answer":
                r = non_answer.query(f"layer == {layer} and visit == {visit} and head == {head}")
                got = r[list(case_tables.NON_ANSWER_STATS)].to_numpy()[0]
                assert got == pytest.approx(np.delete(mean[head], 1), abs=ATOL)
                uniform = [f"{s}_uniform" for s in case_tables.NON_ANSWER_STATS]
                assert r[uniform].to_numpy()[0] == pytest.approx(np.delete(ref / n, 1), abs=1e-9)
            else:
                r = heads.query(
                    f"n_demos == {group} and layer == {layer} and visit == {visit} "
                    f"and head == {head}"
                )
                got = r[list(group_masses.STATS)].to_numpy()[0]
                assert got == pytest.approx(mean[head], abs=ATOL)
            seen += 1
    assert len(heads) + len(non_answer) == seen


@pytest.mark.parametrize("looped", [True, False], ids=["smelt", "baseline"])
def test_recall_masses_equal_a_brute_force_from_hook_pattern(make_cfg, make_model, looped):
    model = make_model(make_cfg(looped=looped, init_std=0.3, max_seq_len=128), seed=2)
    inputs = ProbeInputs(n_seqs=3, seq_len=64, max_seq_len=128, task="assoc_recall", seed=1)
    tables = case_study.run(model, inputs, OPTS)
    rows = inputs.recall_rows()
    pats = patterns(model, rows)
    acc: dict = {}
    for r, row in enumerate(rows.tolist()):
        ref = scan(row, SPEC.trigger_ids)
        for lv, pat in pats.items():
            for q, n in ref["n"].items():
                add_query(acc, (n, *lv), pat[r], q, ref["demos"].get(q, set()))
            for q in ref["non_answer"]:
                add_query(acc, ("non_answer", *lv), pat[r], q, set())
    assert {g for g, *_ in acc} >= {0, 1, "non_answer"}
    check_tables(tables, acc, model)
    check_answer_tables(tables, acc, model, range(1, MAX_DEMOS + 1))
    assert set(tables["heads"]["task"]) == {"assoc_recall"}
    assert set(tables["answer"]["task"]) == {"assoc_recall"}


@pytest.mark.parametrize("looped", [True, False], ids=["smelt", "baseline"])
def test_dyck_masses_equal_a_brute_force_from_hook_pattern(make_cfg, make_model, looped):
    model = make_model(make_cfg(looped=looped, init_std=0.3, max_seq_len=128), seed=3)
    inputs = ProbeInputs(n_seqs=3, max_seq_len=128, demos=(0, 2), task="dyck", seed=4)
    tables = case_study.run(model, inputs, OPTS)
    acc: dict = {}
    for group in group_masses.by_demos(inputs.dyck_examples()).values():
        tokens, _ = dyck_batch(group)
        pats = patterns(model, tokens)
        for r, ex in enumerate(group):
            start, end = ex.answer_span
            answer = set(range(start - 1, end - 1))
            demo = {k for s, t in ex.demo_answer_spans for k in range(s, t)}
            for lv, pat in pats.items():
                for q in range(1, len(ex.ids)):
                    if q in answer:
                        add_query(acc, (ex.n_demos, *lv), pat[r], q, demo)
                    else:
                        add_query(acc, ("non_answer", *lv), pat[r], q, set())
    check_tables(tables, acc, model)
    check_answer_tables(tables, acc, model, [2])  # the prompts with demonstrations


@pytest.mark.parametrize("looped", [True, False], ids=["smelt", "baseline"])
def test_dyck_words_without_demonstrations_pool_every_answer_position(make_cfg, make_model, looped):
    """Words posed without demonstrations (the seeds command's held-out words): the answer
    table pools every answer position, with no demonstration mass and a demonstration share of
    0, the rest equal to the brute force."""
    model = make_model(make_cfg(looped=looped, init_std=0.3, max_seq_len=128), seed=7)
    examples = ProbeInputs(n_seqs=4, max_seq_len=128, demos=(0,), seed=3).dyck_examples()
    masses = group_masses.dyck_masses(model, examples, batch_size=3, chunk=4)
    tables = case_tables.mass_tables(masses, model.schedule)
    acc: dict = {}
    tokens, _ = dyck_batch(examples)
    pats = patterns(model, tokens)
    for r, ex in enumerate(examples):
        start, end = ex.answer_span
        for lv, pat in pats.items():
            for q in range(1, len(ex.ids)):
                group = 0 if start - 1 <= q < end - 1 else "non_answer"
                add_query(acc, (group, *lv), pat[r], q, set())
    check_answer_tables(tables, acc, model, [0])
    answer = tables["answer"]
    assert (answer["demo_mean"] == 0).all() and (answer["demo_share"] == 0).all()
    assert in_unit_interval(tables["answer"])


def in_unit_interval(answer) -> bool:
    masses = [c for c in answer if c.startswith(("bos_", "demo_", "na_bos_")) and "head" not in c]
    return bool(((answer[masses] >= -1e-12) & (answer[masses] <= 1 + 1e-12)).all().all())


def test_the_four_masses_sum_to_one_at_every_answer_position(make_cfg, make_model):
    """Each query its own group: bos + demo + prev + self + rest = 1 per answer position, head
    and visit (the sets are disjoint and cover every key)."""
    model = make_model(make_cfg(init_std=0.5, max_seq_len=128), seed=5)
    rows = ProbeInputs(n_seqs=2, seq_len=96, seed=2).recall_rows()
    case = recall_case(rows, SPEC.trigger_ids)
    _, cache = capture(model, rows, qk_hook_names(model.schedule))
    t = rows.shape[1]
    pos = torch.arange(t)[None].expand(rows.shape[0], -1)
    for layer, visit in model.schedule:
        q, k = (cache[hook_name(layer, visit, f"attn.hook_{x}")] for x in "qk")
        per_query = grouped_mass(qk_rows(q, k), pos, pos, t, case.key_sets(), chunk=7)
        total = per_query.sum(dim=-1)  # [b, T (one query a group), H]
        answer = case.scored
        assert int(answer.sum()) > 10
        assert torch.allclose(total[answer], torch.ones(()).double(), atol=1e-6)
        shown = case.n_demos >= 1  # answer positions after a demonstration
        assert (per_query[shown][..., 1] > 0).all() and (per_query[answer][..., 0] > 0).all()
    heads = case_study.run(
        model, ProbeInputs(n_seqs=2, seq_len=96, seed=2, task="assoc_recall"), OPTS
    )["heads"]
    assert np.allclose(heads[list(group_masses.MASS_STATS)].sum(axis=1), 1.0, atol=1e-6)
    assert set(heads["n_demos"]) <= set(range(MAX_DEMOS + 1))


def test_dyck_masses_are_the_per_prompt_key_set_ones(make_cfg, make_model):
    """The Dyck BOS and demonstration masses equal the formulation the dyck probe used: one
    pair of key sets per prompt (BOS, demonstration answer spans), answer positions only."""
    model = make_model(make_cfg(init_std=0.3, max_seq_len=128), seed=6)
    examples = ProbeInputs(n_seqs=4, max_seq_len=128, demos=(1, 2), seed=8).dyck_examples()
    heads = case_tables.dyck_heads(model, examples, batch_size=3, chunk=4)
    for n_demos, group in group_masses.by_demos(examples).items():
        tokens, _ = dyck_batch(group)
        _, cache = capture(model, tokens, qk_hook_names(model.schedule))
        q_pos, q_valid = answer_positions([ex.answer_span for ex in group])
        width = tokens.shape[1]
        sets = torch.stack(
            [
                span_mask([[(0, 1)]] * len(group), width, tokens.device),
                span_mask([ex.demo_answer_spans for ex in group], width, tokens.device),
            ],
            dim=1,
        )
        for layer, visit in model.schedule:
            q, k = (cache[hook_name(layer, visit, f"attn.hook_{x}")] for x in "qk")
            old = key_set_mass(q, k, q_pos, q_valid, sets, chunk=3).sum(dim=0) / q_valid.sum()
            per_query = sets[:, None].expand(-1, q_pos.shape[1], -1, -1)  # the same sets per query
            same = key_set_mass(q, k, q_pos, q_valid, per_query, chunk=3).sum(dim=0) / q_valid.sum()
            assert torch.allclose(same, old, atol=1e-12)
            got = heads.query(f"n_demos == {n_demos} and layer == {layer} and visit == {visit}")
            assert got["bos_mass"].to_numpy() == pytest.approx(old[:, 0].numpy(), abs=1e-6)
            assert got["demo_mass"].to_numpy() == pytest.approx(old[:, 1].numpy(), abs=1e-6)


def test_the_case_task_is_the_asked_one_else_the_checkpoints():
    assert ProbeInputs(trained_task="assoc_recall").case_task == "assoc_recall"
    assert ProbeInputs(trained_task="assoc_recall", task="dyck").case_task == "dyck"


# ----- the command on a tiny trained checkpoint ---------------------------------------------
@pytest.fixture(scope="module")
def recall_ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("recall-tiny")
    code, _, err = run_command(
        "smelt_interp.train",
        *("--preset", "recall-pair-tiny", "--arch", "baseline", "--out", out, "--quiet"),
        *("--set", "steps=20", "--set", "eval_every=10", "--set", "threads=1"),
    )
    assert code == 0, err
    return out / "baseline" / "ckpt.pt"


def test_command_defaults_to_the_trained_task_and_runs_both(recall_ckpt, tmp_path):
    small = ("--n-seqs", "2", "--seq-len", "64", "--batch-size", "2")
    runs = defaultdict(dict)
    for task in (None, "dyck"):
        js = tmp_path / f"{task}.json"
        flags = ("--task", task, "--demos", "0,1") if task else ()
        code, out, err = run_command(
            "smelt_interp.probes.case_study", recall_ckpt, *small, *flags, "--json", js
        )
        assert code == 0, err
        runs[task] = json.loads(js.read_text())
        assert "bos mass from answers, loop span, visit 0" in out
    recall, dyck = runs[None]["tables"], runs["dyck"]["tables"]
    assert runs[None]["probe"] == "case_study"
    assert {r["task"] for r in recall["heads"]} == {"assoc_recall"}
    assert {r["kind"] for r in recall["accuracy"]} == {"next_token"}
    assert {r["task"] for r in dyck["heads"]} == {"dyck"}
    assert {r["n_demos"] for r in dyck["heads"]} == {0, 1}
    for tables in (recall, dyck):
        assert list(tables) == list(case_study.PROBE.tables)
        assert set(tables) >= {
            "visits", "heads", "non_answer", "accuracy", "sink", "trend", "visit_diff"
        }  # fmt: skip
        assert len(tables["sink"]) == 1 and 0 <= tables["sink"][0]["sink03_64"] <= 1
        for r in tables["heads"]:
            assert r["bos_mass_lo"] <= r["bos_mass"] + 1e-9 <= r["bos_mass_hi"] + 2e-9


def test_a_wrong_task_is_one_error_line(recall_ckpt):
    code, _, err = run_command("smelt_interp.probes.case_study", recall_ckpt, "--task", "recall")
    assert_one_line_error(code, err, "--task", "recall")
