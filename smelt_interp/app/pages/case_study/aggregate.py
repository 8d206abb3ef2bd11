"""The case study over many held-out examples, led by the paper's quantity: per (layer, visit),
the attention mass from the answer positions onto BOS and onto the demonstration answers as the
mean over heads (the paper's claim is over all heads), the best head beside it, and uniform
attention's levels on the same positions; BOS mass at the non-answer positions is the second
view. Drawn from the `case_study` probe's tables for the chosen task (`heads`, `visits` with
bootstrap intervals, `non_answer`, `visit_diff`), cut to one demonstration count, beside the
paper's Dyck values (smelt_interp.paper.DYCK). Every served model the probe applies to is
measured on the chosen task's rows; those trained on another task are marked so."""

from __future__ import annotations

import pandas as pd
from dash import Output, html

from smelt_interp import paper
from smelt_interp.app import components as ui
from smelt_interp.app import value_kinds as kind
from smelt_interp.app.controls import Control, Controls
from smelt_interp.app.figure_cache import FigureCache
from smelt_interp.app.pages.case_study.quantity import COLUMNS as QUANTITY_COLUMNS
from smelt_interp.app.pages.case_study.quantity import NOT_TRAINED
from smelt_interp.app.pages.case_study.task import LOAD, TASK, TASKS, ids_only_note, task_of
from smelt_interp.app.pages.case_study.widgets import dropdown
from smelt_interp.app.probe_tables import probe_tables, task_request
from smelt_interp.app.served import Served, provenance_of, text_models
from smelt_interp.errors import ProbeError, SmeltError
from smelt_interp.figures import case_study as case_figs
from smelt_interp.figures.theme import message_figure
from smelt_interp.measure import case_heads
from smelt_interp.probes.common import loop_span
from smelt_interp.probes.registry import get

PROBE = "case_study"  # the registered probe whose tables this view draws
CONTROLS = Controls(n_demos=Control("case-n-demos", "value", kind.INDEX, url=int))
# The view's answers are kept by (task, n_demos, served models and their versions): the
# callback runs no model, and redrawing the same figure and tables per request is what made
# it slow under many users.
VIEW_CACHE_SIZE = 32


def layout(served: Served, state: dict) -> html.Section:
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
        subtitle="The case_study probe's masses per (layer, visit), computed once per model on "
        "the chosen task's held-out rows (recall) or prompts (Dyck). First the paper's "
        "quantity: the mass from the answer positions on BOS and on the demonstration answers, "
        "as the mean over heads (lines, with 95% percentile bootstrap intervals over rows or "
        "prompts) and the best head (stars); dotted, what uniform attention would give on the "
        "same positions. Then BOS mass at the non-answer positions (head mean; stars: the head "
        "with the most, with its interval). Visit 1 minus visit 0 pairs each head with itself. "
        "For recall, the demonstrations are the trigger's earlier occurrences in the row (the "
        "last choice counts that many or more). Models trained on the other task are drawn "
        "pale and marked in the table.",
    )


def task_tables(served: Served, task: str) -> dict:
    """{model: the probe's tables} on `task` (the report's inputs, on that task's rows)."""
    return probe_tables(served, get(PROBE), task_request(served, task))


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


def trained_on(served: Served, task: str) -> dict[str, bool]:
    """{served model: whether it trained on `task`}."""
    return {name: provenance_of(served, name).task == task for name in served.registry.names}


def references(served: Served, task: str) -> pd.DataFrame:
    """Uniform attention's levels on the rows or prompts the probe measured for `task` (its
    `levels` table: the same positions for every model, so the first model's)."""
    tables = task_tables(served, task)
    for t in tables.values():
        return for_task(t["levels"], task)
    return pd.DataFrame(columns=["n_demos", "n", "uniform_bos", "demo_share"])


def reference_levels(levels: pd.DataFrame, n: int) -> dict[str, float]:
    """The figure's reference levels for answer positions with `n` demonstrations."""
    out: dict[str, float] = {}
    answer = levels[levels["n_demos"] == n]
    if len(answer):
        out["uniform_bos"] = float(answer["uniform_bos"].iloc[0])
        out["demo_share"] = float(answer["demo_share"].iloc[0])
    rest = levels[levels["n_demos"] == -1]
    if len(rest):
        out["uniform_bos_non_answer"] = float(rest["uniform_bos"].iloc[0])
    return out


def _ci(value: float, lo: float, hi: float, sign: str = "+") -> str:
    return f"{value:{sign}.3f} [{lo:{sign}.3f}, {hi:{sign}.3f}]"


def head_counts(heads: dict[str, pd.DataFrame]) -> dict[str, int]:
    """{model: heads a layer} from the per-head tables."""
    return {name: int(h["head"].max()) + 1 for name, h in heads.items() if not h.empty}


def head_count_note(counts: dict[str, int]) -> str | None:
    """A sentence when the models compared have different head counts, else None."""
    if len(set(counts.values())) < 2:
        return None
    each = ", ".join(f"{name} {n}" for name, n in counts.items())
    return (
        f"The models have different head counts (heads a layer: {each}): compare the head "
        "means; a best head is the largest of more heads in one model than in another."
    )


def reference_line(levels: dict[str, float]) -> str:
    parts = []
    if "uniform_bos" in levels:
        parts.append(
            f"uniform attention at these answer positions: BOS {levels['uniform_bos']:.3f}, "
            f"demonstration answers {levels['demo_share']:.3f} (their share of the keys)"
        )
    if "uniform_bos_non_answer" in levels:
        parts.append(f"at the non-answer positions: BOS {levels['uniform_bos_non_answer']:.3f}")
    return "reference, " + "; ".join(parts) if parts else ""


def diff_text(name: str, table: dict, per_head: pd.DataFrame, task: str, n: int) -> list[str]:
    """Visit 1 minus visit 0 per looped layer: the head mean with its interval (the probe's
    `visit_diff`) and each head paired with itself (`per_head`: case_heads.same_head_diff)."""
    parts = []
    if "visit_diff" in table:
        diff = for_task(table["visit_diff"], task)
        diff = diff[(diff["n_demos"] == n) & diff["statistic"].isin(case_heads.ANSWER_STATS)]
        for r in diff.itertuples():
            same = per_head[(per_head["layer"] == r.layer) & (per_head["statistic"] == r.statistic)]
            each = ", ".join(f"head {int(h.head)} {h.diff:+.3f}" for h in same.itertuples())
            stat = r.statistic.replace("_mass", "")
            parts.append(
                f"layer {r.layer} {stat} head mean {_ci(r.diff, r.lo, r.hi)}"
                + (f" ({each})" if each else "")
            )
    if "trend" in table:
        trend = for_task(table["trend"], task)
        trend = trend[(trend["n_demos"] == n) & (trend["statistic"] == "bos_mass")]
        parts += [
            f"BOS mass slope per depth {_ci(r.slope, r.lo, r.hi)}" for r in trend.itertuples()
        ]
    return parts


def aggregate(served: Served, task: str, n_demos: int | None) -> tuple:
    """(figure, text lines, tables, n_demos drawn) of the probe's tables for `task`, cut to one
    demonstration count (default: the most)."""
    if not text_models(served):  # only model folders without a tokenizer: no prompt to pose
        why = ids_only_note(served) or "no models"
        return message_figure(why), [why], None, None
    try:
        tables = task_tables(served, task)
    except ProbeError as exc:  # the probe is not registered in this process
        return message_figure(str(exc)), [str(exc)], None, None
    counts = demo_counts(tables, task)
    if not counts:
        why = f"the {PROBE} probe measured no {TASKS[task]} examples on the served models"
        return message_figure(why), [why], None, None
    n = n_demos if n_demos in counts else counts[-1]
    trained = trained_on(served, task)
    # the models trained on the task first, then the others
    order = sorted(tables, key=lambda name: not trained.get(name, False))
    visits, heads, non_answer = {}, {}, {}
    for name in order:
        t = tables[name]
        v = for_task(t["visits"], task)
        visits[name] = v[v["n_demos"] == n]
        h = for_task(t["heads"], task)
        heads[name] = h[h["n_demos"] == n]
        non_answer[name] = for_task(t["non_answer"], task)
    views = {name: case_heads.head_views(heads[name], non_answer[name]) for name in order}
    best = {name: v.best for name, v in views.items()}
    levels = reference_level_or_none(served, task, n)
    bos, demo = paper.DYCK_BOS_MASS, paper.DYCK_DEMO_MASS
    lines: list = [
        f"paper (SMELT, Dyck, mean over heads at the answer positions), visit 0 → visit 1: "
        f"BOS {bos}, demonstrations {demo}; visit 1 - visit 0: BOS {bos.hi - bos.lo:+.2f}, "
        f"demonstrations {demo.hi - demo.lo:+.2f}"
    ]
    if reference_line(levels):
        lines += [html.Br(), reference_line(levels)]
    note = head_count_note(head_counts(heads))
    if note:
        lines += [html.Br(), note]
    for name in order:
        parts = diff_text(name, tables[name], views[name].same_head, task, n)
        if parts:
            mark = "" if trained.get(name) else f", {NOT_TRAINED}"
            lines += [html.Br(), html.Span([html.B(f"ours ({name}{mark}): "), "; ".join(parts)])]
    title = f"{TASKS[task]}, {demo_label(task, n, counts[-1])}"
    figure = case_figs.per_visit_aggregate(
        visits,
        views,
        references=levels,
        faded=[name for name in order if not trained.get(name)],
        title=title,
    )
    shown = html.Div(
        [
            answer_table(visits, best, trained),
            html.H3("Second view: BOS mass at the non-answer positions", className="case-h3"),
            non_answer_table(views, trained),
        ]
    )
    return figure, lines, shown, n


def reference_level_or_none(served: Served, task: str, n: int) -> dict[str, float]:
    """reference_levels for `task` at `n` demonstrations; {} where the rows cannot be built."""
    try:
        return reference_levels(references(served, task), n)
    except SmeltError:
        return {}


def _trained_label(trained: dict[str, bool], name: str) -> str:
    return "yes" if trained.get(name) else NOT_TRAINED


def answer_table(
    visits: dict[str, pd.DataFrame], best: dict[str, pd.DataFrame], trained: dict[str, bool]
):
    """One row per (model, layer, visit) at the answer positions: the head means with their
    intervals, the best head's value (and which head), and the paper's SMELT value at that visit
    for the layers of the loop span."""
    rows = []
    for name, frame in visits.items():
        span = set(loop_span(frame)) if not frame.empty else set()
        summary = best.get(name, pd.DataFrame())
        for r in frame.sort_values("depth").itertuples():
            top = summary[(summary["layer"] == r.layer) & (summary["visit"] == r.visit)]
            in_span = r.layer in span

            def best_of(stat: str) -> str:
                if not len(top):
                    return "–"
                row = top.iloc[0]
                return f"{row[f'{stat}_best']:.3f} (head {int(row[f'{stat}_best_head'])})"

            rows.append(
                [
                    name,
                    _trained_label(trained, name),
                    int(r.layer),
                    int(r.visit),
                    int(top.iloc[0]["n_heads"]) if len(top) else "–",
                    _ci(r.bos_mass, r.bos_mass_lo, r.bos_mass_hi, sign=""),
                    best_of("bos_mass"),
                    _ci(r.demo_mass, r.demo_mass_lo, r.demo_mass_hi, sign=""),
                    best_of("demo_mass"),
                    paper.DYCK_BOS_MASS.at_visit(int(r.visit)) if in_span else "",
                    paper.DYCK_DEMO_MASS.at_visit(int(r.visit)) if in_span else "",
                ]
            )
    columns = [*QUANTITY_COLUMNS, "paper BOS", "paper demos"]
    return ui.table(columns, rows, class_name="case-aggregate")


def non_answer_table(views: dict[str, case_heads.HeadViews], trained: dict[str, bool]):
    """One row per (model, layer, visit) at the non-answer positions: BOS mass as the head mean
    and the head with the most, with its interval."""
    rows = []
    for name, view in views.items():
        means, tops = view.non_answer_mean, view.non_answer_top
        if means.empty:
            continue
        for r in means.itertuples():
            top = tops[(tops["layer"] == r.layer) & (tops["visit"] == r.visit)].iloc[0]
            park = f"{_ci(*top[['bos_mass', 'bos_mass_lo', 'bos_mass_hi']], sign='')}"
            rows.append(
                [
                    name,
                    _trained_label(trained, name),
                    int(r.layer),
                    int(r.visit),
                    f"{r.bos_mass:.3f}",
                    f"{park} (head {int(top['head'])})",
                ]
            )
    columns = [
        "model",
        "trained on this task",
        "layer",
        "visit",
        "BOS (non-answer), head mean",
        "BOS (non-answer), top head",
    ]
    return ui.table(columns, rows, class_name="case-non-answer")


def view(cache: FigureCache, served: Served, task: str, n_demos: int | None) -> tuple:
    """The callback's answer (options, n_demos drawn, figure, text, tables), computed once per
    (task, n_demos, served models and versions) and kept in the page's `cache`."""

    def compute() -> tuple:
        figure, lines, table, drawn = aggregate(served, task, n_demos)
        counts = demo_counts(task_tables(served, task), task) if drawn is not None else []
        options = [{"label": demo_label(task, n, counts[-1]), "value": n} for n in counts]
        return options, drawn, figure, lines, table

    return cache.answer("case-aggregate", [task, n_demos], compute)


def register(app, served: Served) -> None:
    figures = FigureCache(served.registry, maxsize=VIEW_CACHE_SIZE)  # shared by users

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
        return view(figures, served, task_of(served, task), n_demos)
