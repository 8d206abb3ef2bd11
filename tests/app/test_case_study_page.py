"""The dashboard's case-study page and its figures: the over-training figure draws every head of
every (layer, visit) of the trainer's long table; the page lays out for both tasks,
switches between them through the app's server, draws the `case_study` probe's tables for the
chosen task, marks a held-out recall row's position sets as data.assoc_recall defines them,
and draws the over-training figure from a run's metrics.jsonl, redrawing only when it grows."""

from __future__ import annotations

import base64
import itertools
import json

import numpy as np
import pandas as pd
import pytest
import test_app
from test_app import walk
from test_app_pending import post

from smelt_interp.app.pages import case_study as page
from smelt_interp.app.pages.case_study import aggregate, over_training, recall
from smelt_interp.app.pages.case_study.recall import recall_row
from smelt_interp.app.pages.case_study.task import TASKS, default_task
from smelt_interp.app.probe_tables import probe_tables, task_request
from smelt_interp.app.prompt_run import cached_run
from smelt_interp.app.registry import ModelRegistry
from smelt_interp.app.served import Served, shortest_context
from smelt_interp.checkpoint import save_checkpoint
from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_rows
from smelt_interp.data.dyck_draws import VALIDATION
from smelt_interp.figures import case_study as figs
from smelt_interp.probes import registry as probes
from smelt_interp.probes.inputs import ProbeRequest
from smelt_interp.train.case_eval import case_history

pair = test_app.pair  # the dashboard tests' random-init pair (a fixture)


@pytest.fixture
def wb(pair) -> Served:
    """The pair served with Dyck prompts from the validation draw: the tiny models' 128-token
    rows leave too few held-out words for a test draw kept apart from it."""
    return Served(ModelRegistry.from_models(pair), probe_request=ProbeRequest(draw=VALIDATION))


@pytest.fixture
def case_probe():
    """The registered `case_study` probe."""
    return probes.get(aggregate.PROBE)


# ----- the over-training figure ---------------------------------------------------------------
def long_table(seed: int, schedule, heads: int, steps=(50, 100, 150)) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for step in steps:
        for (layer, visit), head in itertools.product(schedule, range(heads)):
            for stat in ("bos_non_answer", "demo_answer", "bos_answer"):
                rows.append((step, 1000 * step, layer, visit, head, stat, rng.uniform()))
        for stat in ("answer_acc", "first_acc"):
            rows.append((step, 1000 * step, np.nan, np.nan, np.nan, stat, rng.uniform()))
    return pd.DataFrame(rows, columns=list(figs.LONG_COLUMNS))


def test_over_training_draws_every_head():
    schedules = {"baseline": [(0, 0), (1, 0), (2, 0)], "smelt": [(0, 0), (1, 0), (1, 1), (2, 0)]}
    tables = {name: long_table(i, s, heads=3) for i, (name, s) in enumerate(schedules.items())}
    fig = figs.over_training(tables, uniform={"smelt": 0.125})
    checked = 0
    for name, table in tables.items():
        for stat, label in figs.TRAINING_PANELS:
            for (layer, visit), head in itertools.product(schedules[name], range(3)):
                key = f"layer {layer} · visit {visit}, head {head}<"
                [trace] = [
                    t
                    for t in fig.data
                    if t.hovertemplate.startswith(f"<b>{name}</b> {key}")
                    and label in t.hovertemplate
                ]
                # the reference: a slow loop over the hand-made rows
                expect = [
                    (r.tokens, r.value)
                    for r in table.itertuples()
                    if (r.layer, r.visit, r.head, r.statistic) == (layer, visit, head, stat)
                ]
                assert list(trace.x) == [x for x, _ in expect]
                assert np.allclose(trace.y, [y for _, y in expect])
                assert trace.line.dash == ("dash" if visit == 1 else "solid")
                checked += 1
    assert checked == 3 * 3 * (3 + 4)  # panels x heads x (layer, visit)s
    per_head = [t for t in fig.data if ", head " in (t.hovertemplate or "")]
    assert len(per_head) == checked  # one trace per head, nothing drawn over them
    accuracy = [t for t in fig.data if t.name == "accuracy at answer positions"]
    assert len(accuracy) == 2
    smelt_acc = tables["smelt"][tables["smelt"]["statistic"] == "answer_acc"]["value"]
    assert any(np.allclose(t.y, smelt_acc) for t in accuracy)
    # uniform attention's BOS level in the two BOS panels of the model that has one
    uniform = [t for t in fig.data if t.name == "uniform attention on BOS"]
    assert len(uniform) == len(figs.BOS_PANELS) and all(list(t.y) == [0.125] * 2 for t in uniform)
    assert "every head" in fig.layout.title.text  # the title says what is drawn


def test_over_training_without_records_says_so():
    empty = pd.DataFrame(columns=list(figs.LONG_COLUMNS))
    fig = figs.over_training({"baseline": empty})
    assert not fig.data and "no case-study evaluations" in fig.layout.annotations[0].text


# ----- the page ------------------------------------------------------------------------------
def test_page_lays_out_both_tasks_and_redirects_from_dyck(wb, case_probe):
    from smelt_interp.app.server import create_app

    for task, shown in (("assoc_recall", "case-recall"), ("dyck", "case-dyck")):
        layout = page.layout(wb, {"task": task})
        styles = {c.id: c.style for c in walk(layout) if getattr(c, "id", None) in _SECTIONS}
        assert styles[shown] == page.SHOWN
        assert [s for s in styles.values() if s == page.HIDDEN] == [page.HIDDEN]
    # models trained on nothing recorded: the probe's default task, Dyck
    assert default_task(wb) == "dyck"
    app = create_app(wb)
    response = app.server.test_client().get("/dyck")
    assert response.status_code in (301, 302, 307, 308)
    assert response.headers["Location"].endswith(page.PATH)


_SECTIONS = ("case-recall", "case-dyck")


def test_url_groups_cover_every_key_once():
    keys = [key for group in page.URL_GROUPS for key in group]
    assert sorted(keys) == sorted(page.QUERY) and len(keys) == len(set(keys))


def test_task_switch_through_the_server(wb, case_probe):
    from smelt_interp.app.server import create_app

    app = create_app(wb)
    output = "..case-recall.style...case-dyck.style.."
    for task, expect in (("assoc_recall", ["block", "none"]), ("dyck", ["none", "block"])):
        answer = post(app, output, [{"id": "case-task", "property": "value", "value": task}], [])
        assert [answer[s]["style"]["display"] for s in _SECTIONS] == expect
    # a task the page does not have is refused by the guard, not drawn
    body = [{"id": "case-task", "property": "value", "value": "nope"}]
    response = app.server.test_client().post(
        "/_dash-update-component",
        json={"output": output, "outputs": [], "inputs": body, "changedPropIds": [], "state": []},
    )
    assert response.status_code >= 400


def test_aggregate_draws_the_probe_tables_of_the_chosen_task(wb, case_probe):
    for task in TASKS:
        tables = probe_tables(wb, case_probe, task_request(wb, task))
        assert set(tables) == {"baseline", "smelt"}
        counts = aggregate.demo_counts(tables, task)
        assert counts and (task == "dyck" or 0 not in counts)
        n = counts[-1]
        figure, lines, table, drawn = aggregate.aggregate(wb, task, None)
        assert drawn == n
        # the BOS panel's lines: the visits table of this task and n_demos, per (model, visit)
        for name, t in tables.items():
            v = aggregate.for_task(t["visits"], task)
            v = v[v["n_demos"] == n]
            for visit, part in v.groupby("visit"):
                [trace] = [
                    tr
                    for tr in figure.data
                    if tr.name == f"{name} · visit {visit}" and tr.xaxis == "x"
                ]
                ys = [y for y in trace.y if y is not None]
                assert np.allclose(ys, part.sort_values("depth")["bos_mass"])
        answer = table.children[0]
        rows = [[c.children for c in r.children] for r in answer.children[1].children]
        n_rows = 0
        for t in tables.values():
            v = aggregate.for_task(t["visits"], task)
            n_rows += int((v["n_demos"] == n).sum())
        assert len(rows) == n_rows
        # the paper's values stand beside the loop span's rows of the looped model
        smelt_rows = [r for r in rows if r[0] == "smelt" and r[2] in (1, 2)]
        assert {(r[3], r[9]) for r in smelt_rows} == {(0, "0.60"), (1, "0.02")}
        assert "0.60 -> 0.02" in lines[0]
    # another demonstration count is another cut of the same table
    other = aggregate.aggregate(wb, "dyck", 1)
    assert other[3] == 1 and other[0].data[0].y != aggregate.aggregate(wb, "dyck", 4)[0].data[0].y


def test_recall_row_marks_the_position_sets(wb):
    ex = recall_row(wb, "smelt", 3)
    spec = AssocRecallSpec()
    ids = recall_rows(1, shortest_context(wb), seed=3, split="heldout", spec=spec)[0].tolist()
    assert ex.ids == ids
    # brute force: a trigger seen before is an answer position; its demos follow each earlier one
    for q, token in enumerate(ids[:-1]):
        earlier = [i for i in range(q) if ids[i] == token] if token in spec.trigger_ids else []
        assert (q in ex.answer) == bool(earlier)
        if earlier:
            assert ex.demos[q] == [i + 1 for i in earlier]
    spans = recall.token_view(ex, ex.answer[0])
    classes = [s.className.split() for s in spans]
    assert "tok-bos" in classes[0]
    assert [i for i, c in enumerate(classes) if "tok-demo" in c] == ex.demos[ex.answer[0]]
    assert [i for i, c in enumerate(classes) if "tok-answer" in c] == ex.answer
    assert all(ex.labels[i].startswith("T") for i, c in enumerate(classes) if "tok-trigger" in c)


def test_recall_attention_is_the_pattern_row_of_the_chosen_head(wb):
    ex = recall_row(wb, "smelt", 0)
    q = ex.answer[0]
    note, tokens, figure, drawn = recall.recall_view(wb, "smelt", 0, 1, 1, 0, q)
    assert drawn == {"layer": 1, "visit": 1, "head": 0, "query": q}
    run = cached_run(wb, "smelt", ex.text)
    expected = run.pattern(1, 1)[0, q, : q + 1]
    drawn = np.zeros(q + 1)
    for trace in figure.data:
        drawn[list(trace.x)] = trace.y
    assert np.allclose(drawn, expected)
    assert f"layer 1 visit 1 head 0, from answer position {q}" in note
    # the Baseline has no visit 1: its visit 0 of the same layer is drawn
    note, *_ = recall.recall_view(wb, "baseline", 0, 1, 1, 0, q)
    assert "layer 1 visit 0 head 0" in note
    # no layer chosen: the (layer, visit, head) with the most mass on the demonstration answers
    note, *_ = recall.recall_view(wb, "smelt", 0, None, None, None, None)
    best = max(
        (
            recall.demo_mass(run.pattern(*lv), ex).max(),
            lv,
            int(recall.demo_mass(run.pattern(*lv), ex).argmax()),
        )
        for lv in run.schedule
    )
    assert f"layer {best[1][0]} visit {best[1][1]} head {best[2]}" in note
    layers, visits, heads, queries = recall.recall_options(wb, "smelt", 0)
    assert [o["value"] for o in queries] == ex.answer and [o["value"] for o in visits] == [0, 1]


def array_of(values) -> np.ndarray:
    """A figure dict's array: plotly writes numbers as base64 typed arrays."""
    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
    return np.asarray(values)


def test_over_training_reads_the_runs_metrics_and_redraws_when_they_grow(tmp_path, pair):
    paths = {}
    for name, model in pair.items():
        paths[name] = tmp_path / name / "ckpt.pt"
        save_checkpoint(paths[name], model)
    schedule = {name: list(m.schedule) for name, m in pair.items()}
    rng = np.random.default_rng(0)

    def write(name: str, step: int) -> None:
        record = {"event": "eval", "step": step, "tokens": 64 * step}
        for (layer, visit), head in itertools.product(schedule[name], range(2)):
            for stat in ("bos_non_answer", "demo_answer", "bos_answer"):
                record[f"case/{stat}/{layer}.{visit}.{head}"] = float(rng.uniform())
        record["case/answer_acc"] = 0.5
        record["case/first_acc"] = 0.1
        with open(tmp_path / name / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")

    for step in (10, 20):
        write("smelt", step)
    served = Served(ModelRegistry(paths))
    seen = over_training.training_signature(served)
    fig = over_training.training_figure(served)  # a kept figure's dict
    table = case_history(tmp_path / "smelt" / "metrics.jsonl")
    every = table[table["statistic"] == "demo_answer"]
    traces = [t for t in fig["data"] if "demonstration-answer" in t["hovertemplate"]]
    assert len(traces) == 2 * len(schedule["smelt"])  # every head; the Baseline has no records
    assert sorted(np.concatenate([array_of(t["y"]) for t in traces])) == sorted(every["value"])
    assert over_training.training_signature(served) == seen  # nothing new: figure kept
    write("baseline", 10)
    assert over_training.training_signature(served) != seen
    fig = over_training.training_figure(served)
    assert any(t["hovertemplate"].startswith("<b>baseline</b>") for t in fig["data"])
