"""The case study over many held-out examples: the `case_study` probe's per-visit aggregate for
the chosen task (its `visits` and `non_answer` tables, with bootstrap intervals) cut to one
demonstration count, beside the paper's Dyck values (smelt_interp.paper.DYCK)."""

from __future__ import annotations

import pandas as pd
from dash import Output, html

from smelt_interp import paper
from smelt_interp.app import components as ui
from smelt_interp.app import value_kinds as kind
from smelt_interp.app.compute import Workbench
from smelt_interp.app.controls import Control, Controls
from smelt_interp.app.pages.case_study.task import LOAD, TASK, TASKS, task_of
from smelt_interp.app.pages.case_study.widgets import dropdown
from smelt_interp.errors import ProbeError
from smelt_interp.figures import case_study as case_figs
from smelt_interp.figures.theme import message_figure
from smelt_interp.probes.common import loop_span
from smelt_interp.probes.registry import get

PROBE = "case_study"  # the registered probe whose tables this view draws
CONTROLS = Controls(n_demos=Control("case-n-demos", "value", kind.INDEX, url=int))


def layout(wb: Workbench, state: dict) -> html.Section:
    """The probe's per-visit aggregate over held-out rows or prompts."""
    return ui.card(
        html.Div(
            ui.field(
                "Demonstrations before the answer",
                dropdown(CONTROLS["n_demos"], state.get("n_demos")),
            ),
            className="controls",
        ),
        html.Div(id="case-aggregate-text", className="paper-line"),
        ui.graph("case-aggregate"),
        html.Div(id="case-aggregate-table", className="case-table"),
        title="Over many held-out examples",
        subtitle="The case_study probe's masses per (layer, visit), computed once per model: "
        "head means at answer positions, and at non-answer positions the head with the most "
        "mass on BOS. Bars and brackets: 95% percentile bootstrap intervals over rows (recall) "
        "or prompts (Dyck). For recall, the demonstrations are the trigger's earlier "
        "occurrences in the row (the last choice counts that many or more).",
    )


def task_tables(wb: Workbench, task: str) -> dict:
    """{model: the probe's tables} on `task` (the report's inputs, on that task's rows)."""
    return wb.probe_tables(get(PROBE), wb.task_request(task))


def for_task(frame: pd.DataFrame, task: str) -> pd.DataFrame:
    """The rows of a probe table that measure `task` (all of them in a table without a task
    column)."""
    return frame[frame["task"] == task] if "task" in frame.columns else frame


def demo_counts(tables: dict, task: str) -> list[int]:
    """The n_demos values the probe's `visits` table holds for `task` (recall: 0, the first
    occurrences, has no demonstrations and is left out)."""
    found = {int(v) for t in tables.values() for v in for_task(t["visits"], task)["n_demos"]}
    return sorted(n for n in found if task == "dyck" or n > 0)


def demo_label(task: str, n: int, most: int) -> str:
    if task == "assoc_recall":
        return f"{n} or more earlier occurrences" if n == most else f"{n} earlier occurrence(s)"
    return f"{n} demonstration{'s' if n != 1 else ''}"


def _ci(value: float, lo: float, hi: float, sign: str = "+") -> str:
    return f"{value:{sign}.3f} [{lo:{sign}.3f}, {hi:{sign}.3f}]"


def aggregate(wb: Workbench, task: str, n_demos: int | None) -> tuple:
    """(figure, text lines, table, n_demos drawn) of the probe's tables for `task`, cut to one
    demonstration count (default: the most)."""
    try:
        tables = task_tables(wb, task)
    except ProbeError as exc:  # the probe is not registered in this process
        return message_figure(str(exc)), [str(exc)], None, None
    counts = demo_counts(tables, task)
    if not counts:
        why = f"the {PROBE} probe measured no {TASKS[task]} examples on the served models"
        return message_figure(why), [why], None, None
    n = n_demos if n_demos in counts else counts[-1]
    visits, non_answer = {}, {}
    for name, t in tables.items():
        v = for_task(t["visits"], task)
        visits[name] = v[v["n_demos"] == n]
        non_answer[name] = for_task(t["non_answer"], task)
    bos, demo = paper.DYCK_BOS_MASS, paper.DYCK_DEMO_MASS
    lines: list = [
        f"paper (SMELT, Dyck), visit 0 → visit 1: BOS {bos}, demonstrations {demo}; "
        f"visit 1 - visit 0: BOS {bos.hi - bos.lo:+.2f}, demonstrations {demo.hi - demo.lo:+.2f}"
    ]
    for name, t in tables.items():
        parts = []
        if "visit_diff" in t:
            diff = for_task(t["visit_diff"], task)
            diff = diff[(diff["n_demos"] == n) & diff["statistic"].isin(["bos_mass", "demo_mass"])]
            parts += [
                f"layer {r.layer} {r.statistic.replace('_mass', '')} {_ci(r.diff, r.lo, r.hi)}"
                for r in diff.itertuples()
            ]
        if "trend" in t:
            trend = for_task(t["trend"], task)
            trend = trend[(trend["n_demos"] == n) & (trend["statistic"] == "bos_mass")]
            parts += [
                f"BOS mass slope per depth {_ci(r.slope, r.lo, r.hi)}" for r in trend.itertuples()
            ]
        if parts:
            lines += [html.Br(), html.Span([html.B(f"ours ({name}): "), "; ".join(parts)])]
    title = f"{TASKS[task]}, {demo_label(task, n, counts[-1])}"
    figure = case_figs.per_visit_aggregate(visits, non_answer, title=title)
    return figure, lines, aggregate_table(visits, non_answer), n


def aggregate_table(visits: dict[str, pd.DataFrame], non_answer: dict[str, pd.DataFrame]):
    """One row per (model, layer, visit): the masses with their intervals, and the paper's
    SMELT value at that visit for the layers of the loop span."""
    rows = []
    for name, frame in visits.items():
        top = case_figs.non_answer_top_head(non_answer.get(name, pd.DataFrame()))
        span = set(loop_span(frame)) if not frame.empty else set()
        for r in frame.sort_values("depth").itertuples():
            parked = top[(top["layer"] == r.layer) & (top["visit"] == r.visit)] if len(top) else top
            park = (
                f"{_ci(*parked.iloc[0][['bos_mass', 'bos_mass_lo', 'bos_mass_hi']], sign='')} "
                f"(head {int(parked.iloc[0]['head'])})"
                if len(parked)
                else "–"
            )
            in_span = r.layer in span
            rows.append(
                [
                    name,
                    int(r.layer),
                    int(r.visit),
                    _ci(r.bos_mass, r.bos_mass_lo, r.bos_mass_hi, sign=""),
                    _ci(r.demo_mass, r.demo_mass_lo, r.demo_mass_hi, sign=""),
                    park,
                    paper.DYCK_BOS_MASS.at_visit(int(r.visit)) if in_span else "",
                    paper.DYCK_DEMO_MASS.at_visit(int(r.visit)) if in_span else "",
                ]
            )
    columns = [
        "model",
        "layer",
        "visit",
        "BOS (answer)",
        "demonstrations (answer)",
        "BOS (non-answer, top head)",
        "paper BOS",
        "paper demos",
    ]
    return ui.table(columns, rows, class_name="case-aggregate")


def register(app, wb: Workbench) -> None:
    @app.callback(
        CONTROLS["n_demos"].output("options"),
        CONTROLS["n_demos"].output(),
        Output(ui.gid("case-aggregate"), "figure"),
        Output("case-aggregate-text", "children"),
        Output("case-aggregate-table", "children"),
        TASK.input,
        CONTROLS["n_demos"].input,
        LOAD.input,
    )
    def _aggregate(task, n_demos, _):
        task = task_of(wb, task)
        figure, lines, table, drawn = aggregate(wb, task, n_demos)
        counts = demo_counts(task_tables(wb, task), task) if drawn is not None else []
        options = [{"label": demo_label(task, n, counts[-1]), "value": n} for n in counts]
        return options, drawn, figure, lines, table
