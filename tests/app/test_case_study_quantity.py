"""The case-study page leads with the paper's quantity: answer-position BOS and
demonstration-answer mass as head means with the best head beside them, visit 1 minus visit 0
of the same head, and uniform attention's levels, each checked against a slow hand computation
from the probe's per-head rows and the rows' tokens; models of another task are listed under the
task they are measured on, marked; and the view's answer is cached, not redrawn per request."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers.recall_scan import scan

from smelt_interp.app.figure_cache import FigureCache
from smelt_interp.app.pages import case_study as page
from smelt_interp.app.pages.case_study import aggregate
from smelt_interp.app.pages.case_study.dyck import cached_case
from smelt_interp.app.pages.case_study.recall import recall_row
from smelt_interp.app.pages.case_study.task import models_by_task
from smelt_interp.app.probe_tables import inputs_for, task_request
from smelt_interp.app.prompt_run import cached_run
from smelt_interp.app.registry import ModelRegistry
from smelt_interp.app.served import Served, shortest_context
from smelt_interp.checkpoint import save_checkpoint
from smelt_interp.measure import case_heads
from smelt_interp.measure import levels as levels_of
from smelt_interp.probes.inputs import ProbeRequest

RECALL_CONFIG = {
    "data": {"assoc_recall": 1.0},
    "assoc_recall": {"n_triggers": 2, "trigger_share": 0.2, "alphabet": 26},
    "seq_len": 64,
}
DYCK_CONFIG = {"data": {"dyck": 1.0}, "seq_len": 64}


@pytest.fixture
def two_tasks(tmp_path, make_cfg, make_model) -> Served:
    """A recall-trained Baseline with 4 heads a layer and a Dyck-trained SMELT with 2, saved
    as checkpoints whose training configs say so (random weights: only the bookkeeping is
    under test)."""
    paths = {
        "baseline-recall": save_checkpoint(
            tmp_path / "recall" / "baseline" / "ckpt.pt",
            make_model(make_cfg(looped=False, max_seq_len=128)),
            train_config=RECALL_CONFIG,
        ),
        "smelt": save_checkpoint(
            tmp_path / "dyck" / "smelt" / "ckpt.pt",
            make_model(make_cfg(looped=True, n_heads=2, n_kv_heads=2, max_seq_len=128), seed=1),
            train_config=DYCK_CONFIG,
        ),
    }
    request = ProbeRequest(n_seqs=4, seq_len=48, demos=(1, 2))
    return Served(ModelRegistry(paths), probe_request=request)


def _cells(table) -> list[list]:
    return [[c.children for c in r.children] for r in table.children[1].children]


def test_head_means_best_heads_and_same_head_pairs_against_a_slow_loop(two_tasks):
    figure, lines, shown, n = aggregate.aggregate(two_tasks, "assoc_recall", None)
    tables = aggregate.task_tables(two_tasks, "assoc_recall")
    answer, non_answer = shown.children[0], shown.children[2]
    rows = _cells(answer)
    for name, t in tables.items():
        heads = t["heads"][t["heads"]["n_demos"] == n]
        for (layer, visit), part in heads.groupby(["layer", "visit"]):
            # the reference: a slow loop over the per-head rows
            values = {"bos_mass": [], "demo_mass": []}
            for r in part.itertuples():
                values["bos_mass"].append((r.bos_mass, r.head))
                values["demo_mass"].append((r.demo_mass, r.head))
            [row] = [r for r in rows if (r[0], r[2], r[3]) == (name, layer, visit)]
            assert row[4] == len(values["bos_mass"])
            for stat, (mean_col, best_col) in {"bos_mass": (5, 6), "demo_mass": (7, 8)}.items():
                mean = sum(v for v, _ in values[stat]) / len(values[stat])
                best_value, best_head = max(values[stat])
                assert row[mean_col].startswith(f"{mean:.3f} [")
                assert row[best_col] == f"{best_value:.3f} (head {best_head})"
            # the figure's head-mean line at this depth is the same mean
            [trace] = [
                tr for tr in figure.data if tr.name == f"{name} · visit {visit}" and tr.xaxis == "x"
            ]
            depth = int(part["depth"].iloc[0])
            drawn = dict(zip(trace.x, trace.y))
            assert drawn[depth] == pytest.approx(part["bos_mass"].mean())
    # the non-answer view: head mean and the head with the most BOS
    for r in _cells(non_answer):
        name, layer, visit = r[0], r[2], r[3]
        t = tables[name]["non_answer"]
        part = t[(t["layer"] == layer) & (t["visit"] == visit)]
        assert r[4] == f"{part['bos_mass'].mean():.3f}"
        assert r[5].endswith(f"(head {int(part.loc[part['bos_mass'].idxmax(), 'head'])})")


def test_same_head_diff_pairs_each_head_with_itself():
    rows = []
    for head, (a, b) in enumerate([(0.6, 0.1), (0.2, 0.7)]):
        rows += [
            {"n_demos": 1, "layer": 1, "visit": 0, "depth": 1, "head": head, "bos_mass": a},
            {"n_demos": 1, "layer": 1, "visit": 1, "depth": 3, "head": head, "bos_mass": b},
        ]
    rows.append({"n_demos": 1, "layer": 0, "visit": 0, "depth": 0, "head": 0, "bos_mass": 0.3})
    diff = case_heads.same_head_diff(pd.DataFrame(rows), stats=("bos_mass",))
    assert diff[["layer", "head"]].values.tolist() == [[1, 0], [1, 1]]
    assert np.allclose(diff["diff"], [0.1 - 0.6, 0.7 - 0.2])
    # best heads would pair head 0 (0.6) with head 1 (0.7): +0.1, not what either head did
    summary = case_heads.head_summary(pd.DataFrame(rows), stats=("bos_mass",))
    looped = summary[summary["layer"] == 1].set_index("visit")
    assert looped.loc[0, "bos_mass_best_head"] == 0 and looped.loc[1, "bos_mass_best_head"] == 1
    assert np.allclose(looped["bos_mass"], [0.4, 0.4])


def test_references_are_uniform_attention_on_the_measured_positions(two_tasks):
    inputs = inputs_for(two_tasks, task_request(two_tasks, "assoc_recall"))
    levels = aggregate.references(two_tasks, "assoc_recall")
    rows = inputs.recall_rows().tolist()
    trigger_ids = inputs.assoc_recall.trigger_ids
    by_n: dict[int, list[tuple[float, float]]] = {}
    rest = []
    for row in rows:
        sets = scan(row, trigger_ids)
        for q in sets["answer"] | sets["first"]:
            demos = sets["demos"].get(q, set())
            by_n.setdefault(sets["n"][q], []).append((1 / (q + 1), len(demos) / (q + 1)))
        rest += [1 / (q + 1) for q in sets["non_answer"]]
    expect = {n: np.mean(v, axis=0) for n, v in by_n.items()}
    got = levels.set_index("n_demos")
    assert sorted(got.index) == sorted([-1, *expect])
    for n, (bos, share) in expect.items():
        assert got.loc[n, "uniform_bos"] == pytest.approx(bos)
        assert got.loc[n, "demo_share"] == pytest.approx(share)
        assert got.loc[n, "n"] == len(by_n[n])
    assert got.loc[-1, "uniform_bos"] == pytest.approx(np.mean(rest))
    # drawn and printed beside the masses
    figure, lines, _, n = aggregate.aggregate(two_tasks, "assoc_recall", None)
    dotted = {t.name for t in figure.data if t.line.dash == "dot"}
    assert f"uniform attention: BOS {expect[n][0]:.3f}" in dotted
    assert any(f"demonstration answers {expect[n][1]:.3f}" in str(x) for x in lines)
    assert levels_of.uniform_bos_share(256) == pytest.approx(
        np.mean([1 / (q + 1) for q in range(1, 256)])
    )


def test_each_task_lists_its_models_and_marks_the_others(two_tasks):
    assert models_by_task(two_tasks) == {"assoc_recall": ["baseline-recall"], "dyck": ["smelt"]}
    listed = page.task_models(two_tasks)
    assert [li.children[1] for li in listed.children] == ["baseline-recall", "smelt"]
    for task, own, other in (("assoc_recall", "baseline-recall", "smelt"), ("dyck", "smelt", None)):
        _, lines, shown, _ = aggregate.aggregate(two_tasks, task, None)
        rows = _cells(shown.children[0])
        models = [r[0] for r in rows]
        assert models.index(own) == 0  # the task's own models first
        assert {r[1] for r in rows if r[0] == own} == {"yes"}
        if other is not None:
            # measured on rows it never saw, marked, with the paper's values in its loop span
            marked = [r for r in rows if r[0] == other]
            assert marked and {r[1] for r in marked} == {aggregate.NOT_TRAINED}
            assert {(r[3], r[9]) for r in marked if r[2] in (1, 2)} == {(0, "0.60"), (1, "0.02")}
        # 4 heads against 2: said in the text
        assert any("different head counts" in str(x) for x in lines)


def test_the_view_is_computed_once_per_task_and_models(two_tasks, monkeypatch):
    calls = []
    real = aggregate.aggregate
    monkeypatch.setattr(aggregate, "aggregate", lambda *a: calls.append(a) or real(*a))
    cache = FigureCache(two_tasks.registry, maxsize=aggregate.VIEW_CACHE_SIZE)
    first = aggregate.view(cache, two_tasks, "assoc_recall", None)
    again = aggregate.view(cache, two_tasks, "assoc_recall", None)
    assert again is first and len(calls) == 1
    options, drawn, figure, *_ = first
    assert [o["value"] for o in options] and drawn == options[-1]["value"]
    assert isinstance(figure, dict) and figure["data"]
    aggregate.view(cache, two_tasks, "dyck", None)
    assert len(calls) == 2


def test_one_recall_row_leads_with_head_means_for_every_model(two_tasks):
    from smelt_interp.app.pages.case_study import recall

    row = next(i for i in range(20) if recall_row(two_tasks, "baseline-recall", i).answer)
    ex = recall_row(two_tasks, "baseline-recall", row)
    line, table = recall.row_quantity(two_tasks, "baseline-recall", row)[:2]
    rows = _cells(table)
    assert {r[0] for r in rows} == {"baseline-recall", "smelt"}
    assert {r[1] for r in rows if r[0] == "smelt"} == {aggregate.NOT_TRAINED}
    for name in ("baseline-recall", "smelt"):
        run = cached_run(two_tasks, name, ex.text)
        for layer, visit in run.schedule:
            weights = run.pattern(layer, visit).astype(np.float64)
            # the reference: per head, a slow loop over the row's answer positions
            bos, demo = [], []
            for h in range(weights.shape[0]):
                bos.append(sum(weights[h, q, 0] for q in ex.answer) / len(ex.answer))
                demo.append(
                    sum(sum(weights[h, q, k] for k in ex.demos[q]) for q in ex.answer)
                    / len(ex.answer)
                )
            [r] = [r for r in rows if (r[0], r[2], r[3]) == (name, layer, visit)]
            assert r[4] == weights.shape[0]
            assert float(r[5]) == pytest.approx(np.mean(bos), abs=6e-4)
            assert r[6].endswith(f"(head {int(np.argmax(bos))})")
            assert float(r[7]) == pytest.approx(np.mean(demo), abs=6e-4)
            assert r[8].endswith(f"(head {int(np.argmax(demo))})")
    uniform = np.mean([1 / (q + 1) for q in ex.answer])
    assert f"BOS {uniform:.3f}" in line.children


def test_one_dyck_prompt_leads_with_head_means_for_every_model(two_tasks):
    from smelt_interp.app.pages.case_study import dyck
    from smelt_interp.data.dyck_text import generate_dyck

    text = generate_dyck(2, 2, 2, 3, shortest_context(two_tasks))
    line, table = dyck.quantity_view(two_tasks, text)
    rows = _cells(table)
    ex = cached_case(two_tasks, "smelt", text).example
    answer = range(ex.answer_span[0] - 1, ex.answer_span[1] - 1)  # queries predicting the answer
    keys = [k for a, b in ex.demo_answer_spans for k in range(a, b)]
    assert f"BOS {np.mean([1 / (q + 1) for q in answer]):.3f}" in line.children
    share = np.mean([sum(k <= q for k in keys) / (q + 1) for q in answer])
    assert f"demonstration answers {share:.3f}" in line.children
    for name in ("smelt", "baseline-recall"):
        heads = cached_case(two_tasks, name, text).heads
        mine = [r for r in rows if r[0] == name]
        assert {r[1] for r in mine} == {"yes" if name == "smelt" else aggregate.NOT_TRAINED}
        for (layer, visit), part in heads.groupby(["layer", "visit"]):
            [r] = [r for r in mine if (r[2], r[3]) == (layer, visit)]
            assert r[5] == f"{sum(part['bos_mass']) / len(part):.3f}"
