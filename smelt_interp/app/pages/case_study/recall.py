"""Case study: where the answer positions look, visit by visit, on two tasks the page switches
between. In-context associative recall (data.assoc_recall), where a sink and induction-style
retrieval grow together at tiny scale, and in-context Dyck, the paper's own case study.

For the chosen task the page shows the `case_study` probe's per-visit aggregate over held-out
rows or prompts (its `visits` and `non_answer` tables, with bootstrap intervals) beside the
paper's Dyck values (smelt_interp.paper.DYCK); the over-training figure from the trainer's
case-study evaluations (refreshed while a run writes them); and one example: for recall a
held-out row with its triggers, answer positions and demonstration answers marked and one
head's attention from an answer position, for Dyck a prompt to build or type with both models'
completions and their per-visit masses. /dyck (the page's old address) redirects here."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
from dash import Input, Output, dcc, html, no_update

from smelt_interp import paper
from smelt_interp.app import components as ui
from smelt_interp.app import urls
from smelt_interp.app import value_kinds as kind
from smelt_interp.app.compute import (
    DEFAULT_DYCK,
    RecallExample,
    Workbench,
    display_labels,
    generate_dyck,
)
from smelt_interp.app.controls import Control, Controls
from smelt_interp.app.pages import attention
from smelt_interp.errors import ProbeError, PromptError
from smelt_interp.figures import case_study as case_figs
from smelt_interp.figures import dyck as figs
from smelt_interp.figures.theme import message_figure
from smelt_interp.probes.common import loop_span
from smelt_interp.probes.registry import get

PATH = "/case-study"
TITLE = "Case study"
REDIRECT_FROM = ("/dyck",)  # the page's address before it covered both tasks
PROBE = "case_study"
PROBES = (PROBE,)  # the registered probes whose tables this page draws
TASKS = {"assoc_recall": "Associative recall", "dyck": "Dyck"}
REFRESH_MS = 5000  # how often the over-training figure looks for new evaluations
# the page's controls (the URL keys in URL order), declared once; QUERY and INPUTS follow
CONTROLS = Controls(
    task=Control("case-task", "value", kind.choice(*TASKS), url=str),
    n_demos=Control("case-n-demos", "value", kind.INDEX, url=int),
    row=Control("recall-row", "value", kind.NUMBER, url=int),
    model=Control("recall-model", "value", kind.NAME, url=str),
    layer=Control("recall-layer", "value", kind.INDEX, url=int),
    visit=Control("recall-visit", "value", kind.INDEX, url=int),
    head=Control("recall-head", "value", kind.INDEX, url=int),
    query=Control("recall-query", "value", kind.INDEX, url=int),
    pairs=Control("dyck-pairs", "value", kind.NUMBER, url=int),
    depth=Control("dyck-depth", "value", kind.NUMBER, url=int),
    demos=Control("dyck-demos", "value", kind.NUMBER, url=int),
    seed=Control("dyck-seed", "value", kind.NUMBER, url=int),
    dyck=Control("dyck-applied", "data", kind.PROMPT, url=str),
    text=Control("dyck-prompt", "value", kind.PROMPT),
    load=Control("case-load", "data", kind.ANY),  # a trigger: the page has appeared
    tick=Control("case-tick", "n_intervals", kind.CLICKS),
    seen=Control("case-seen", "data", kind.text(64)),  # the digest the figure was drawn from
)
QUERY: urls.Query = CONTROLS.query
INPUTS = CONTROLS.kinds
# the Attention page's keys that "Open it on the Attention page" sets
ATTENTION_LINK: urls.Query = {key: attention.QUERY[key] for key in ("model", "prompt")}
SHOWN, HIDDEN = {"display": "block"}, {"display": "none"}
VIEW = ("layer", "visit", "head", "query")  # the recall example's view, chosen or defaulted
URL_GROUPS = (
    ("task", "n_demos", "row", "model", *VIEW),
    ("pairs", "depth", "demos", "seed", "dyck"),
)


def _int(value, default: int, lo: int, hi: int) -> int:
    try:
        return min(hi, max(lo, int(value)))
    except (TypeError, ValueError):
        return default


def settings(state: dict) -> dict[str, int]:
    d = DEFAULT_DYCK
    return {
        "pairs": _int(state.get("pairs"), d["pairs"], 1, 4),
        "depth": _int(state.get("depth"), d["depth"], 1, 10),
        "demos": _int(state.get("demos"), d["demos"], 0, 8),
        "seed": _int(state.get("seed"), d["seed"], 0, 10**9),
    }


def default_task(wb: Workbench) -> str:
    """assoc_recall when a served model trained on it (weight > 0), else dyck: the probe's
    default too."""
    for name in wb.registry.names:
        data = (wb.registry.info(name).train_config or {}).get("data")
        if isinstance(data, dict) and (data.get("assoc_recall") or 0) > 0:
            return "assoc_recall"
    return "dyck"


def task_of(wb: Workbench, value) -> str:
    return value if value in TASKS else default_task(wb)


def _num(id: str, value: int, lo: int, hi: int) -> dcc.Input:
    return dcc.Input(
        id=id, type="number", value=value, min=lo, max=hi, step=1, className="num", debounce=True
    )


def _dropdown(name: str, state: dict) -> dcc.Dropdown:
    """The dropdown of control `name` at its URL value; its options come from a callback."""
    return dcc.Dropdown(
        id=CONTROLS.id(name), value=state.get(name), clearable=False, className="case-dropdown"
    )


# ----- layout ---------------------------------------------------------------------------
def layout(wb: Workbench, state: dict) -> html.Div:
    task = task_of(wb, state.get("task"))
    return html.Div(
        [
            ui.page_head(
                "Case study",
                "Where the positions that predict an answer look, visit by visit. In the "
                "paper's Dyck study, the answer positions of SMELT's first visit look mostly at "
                "BOS and its second visit at the demonstrations' answers. Associative recall is "
                "a task where an attention sink and retrieval from the demonstrations both grow "
                "at this scale.",
            ),
            ui.card(
                ui.radio(CONTROLS.id("task"), list(TASKS), task, list(TASKS.values())),
                title="Task",
                class_name="case-task",
            ),
            aggregate_card(wb, state),
            training_card(),
            html.Div(
                recall_section(wb, state),
                id="case-recall",
                style=SHOWN if task == "assoc_recall" else HIDDEN,
            ),
            html.Div(
                dyck_section(wb, state), id="case-dyck", style=SHOWN if task == "dyck" else HIDDEN
            ),
        ]
    )


def aggregate_card(wb: Workbench, state: dict) -> html.Section:
    """The probe's per-visit aggregate over held-out rows or prompts."""
    return ui.card(
        dcc.Store(id=CONTROLS.id("load"), data=0),
        html.Div(
            ui.field("Demonstrations before the answer", _dropdown("n_demos", state)),
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


def training_card() -> html.Section:
    """The case study over training, redrawn when a run writes a new evaluation."""
    return ui.card(
        dcc.Interval(id=CONTROLS.id("tick"), interval=REFRESH_MS, n_intervals=0),
        dcc.Store(id=CONTROLS.id("seen")),
        ui.graph("case-training", loading=False),
        title="Over training",
        subtitle="From each served run's metrics.jsonl (the trainer's case-study evaluation "
        "on held-out recall rows, while it trains too): per (layer, visit), the head with the "
        "largest value (the hover names it); visit 1 of a looped layer dashed. Refreshed "
        f"every {REFRESH_MS // 1000} s.",
    )


def recall_section(wb: Workbench, state: dict) -> list:
    names = wb.registry.names
    model = wb.registry.valid(state.get("model")) if names else None
    row = _int(state.get("row"), 0, 0, 10**6)
    controls = [
        ui.field("Held-out row", _num(CONTROLS.id("row"), row, 0, 10**6)),
        ui.field("Model", ui.radio(CONTROLS.id("model"), list(names), model)),
        ui.field("Layer", ui.radio(CONTROLS.id("layer"), [], state.get("layer"))),
        ui.field("Visit", ui.radio(CONTROLS.id("visit"), [], state.get("visit"))),
        ui.field("Head", ui.radio(CONTROLS.id("head"), [], state.get("head"))),
        ui.field("Answer position", _dropdown("query", state)),
    ]
    return [
        ui.card(
            html.Div(controls, className="controls"),
            html.Div(id="recall-note", className="note"),
            html.Div(id="recall-tokens", className="recall-tokens"),
            html.Div(
                [
                    html.Span("BOS", className="tok tok-bos"),
                    html.Span("trigger", className="tok tok-trigger"),
                    html.Span("answer position", className="tok tok-answer"),
                    html.Span("chosen answer position", className="tok tok-query"),
                    html.Span("its demonstration answers", className="tok tok-demo"),
                ],
                className="recall-legend",
            ),
            ui.graph("recall-attention"),
            title="One held-out row",
            subtitle="A row of the associative-recall task (never seen in training): bigram "
            "filler, triggers T0, T1, ... each followed by the successor it keeps for the "
            "whole row. At an answer position (a trigger seen before) the model can read the "
            "answer from the demonstration answers: the tokens after the trigger's earlier "
            "occurrences. Defaults: the layer, visit and head with the most mass on them.",
        )
    ]


def dyck_section(wb: Workbench, state: dict) -> list:
    s = settings(state)
    text = state.get("dyck")
    if not text:
        try:
            text = generate_dyck(s["pairs"], s["depth"], s["demos"], s["seed"], wb.max_seq_len)
        except PromptError:
            text = "( [ {"
    prompt = ui.card(
        html.Div(
            [
                ui.field("Bracket pairs", ui.radio(CONTROLS.id("pairs"), [1, 2, 3, 4], s["pairs"])),
                ui.field("Max depth", _num(CONTROLS.id("depth"), s["depth"], 1, 10)),
                ui.field("Demonstrations", _num(CONTROLS.id("demos"), s["demos"], 0, 8)),
                ui.field("Seed", _num(CONTROLS.id("seed"), s["seed"], 0, 10**9)),
                html.Button("Generate", id="dyck-generate", n_clicks=0, className="button"),
            ],
            className="controls",
        ),
        html.P(
            "Held-out examples (never seen in training), sized to fit the models' context.",
            className="note",
        ),
        html.Div(
            ui.prompt_box(
                "dyck",
                text,
                rows=5,
                placeholder="one bracket prefix per line; the last line is the query",
            ),
            style={"marginTop": "14px"},
        ),
        ui.message("dyck-msg"),
        title="Prompt",
        subtitle="Demonstrations' inputs, one per line (they are answered correctly in the "
        "prompt), then the query on the last line.",
    )
    return [
        html.Div(
            [prompt, ui.card(html.Div(id="dyck-results"), title="Completions")],
            className="grid-2",
        ),
        ui.card(
            ui.graph("dyck-mass"),
            title="Where the answer looks, by effective depth",
            subtitle="Attention from the positions that predict the answer, averaged over heads.",
        ),
        ui.card(
            html.Div(id="dyck-paper", className="paper-line"),
            ui.graph("dyck-paper-fig"),
            title="Loop span, visit 0 vs visit 1, beside the paper",
            subtitle="Means over the looped layers (for a Baseline: the layers the recipe "
            "would loop) for this one prompt; the paper averages many.",
        ),
    ]


# ----- the aggregate ----------------------------------------------------------------------
def task_tables(wb: Workbench, task: str) -> dict:
    """{model: the probe's tables} on `task` (the report's inputs with `--task task`)."""
    return wb.probe_tables(get(PROBE), ("--task", task))


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


# ----- over training ----------------------------------------------------------------------
def training_names(wb: Workbench) -> list[str]:
    """Every served run, ready or still training (its metrics exist before its checkpoint)."""
    return list(wb.registry.paths)


def training_signature(wb: Workbench) -> str:
    """A digest of each served run's metrics.jsonl (size and modification time): the figure
    is redrawn only when one changed."""
    parts = []
    for name in training_names(wb):
        try:
            st = wb.metrics_path(name).stat()
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{name}:-")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def training_figure(wb: Workbench):
    return case_figs.over_training({n: wb.case_training(n) for n in training_names(wb)})


# ----- the recall example ------------------------------------------------------------------
def recall_options(wb: Workbench, model: str, row) -> tuple[list, list, list, list]:
    """(layer, visit, head, answer-position) options for `model` on held-out row `row`."""
    name = wb.registry.valid(model)
    cfg = wb.registry.cfg(name)
    ex = wb.recall_example(name, _int(row, 0, 0, 10**6))
    visits = sorted({v for _, v in wb.registry.get(name).schedule})
    as_options = lambda values: [{"label": str(v), "value": v} for v in values]  # noqa: E731
    queries = [
        {"label": f"{q}: {ex.labels[q]}, after {len(ex.demos[q])} earlier", "value": q}
        for q in ex.answer
    ]
    return (
        as_options(range(cfg.n_layers)),
        as_options(visits),
        as_options(range(cfg.n_heads)),
        queries,
    )


def demo_mass(weights: np.ndarray, ex: RecallExample) -> np.ndarray:
    """Per head, the mean over the row's answer positions of the mass on their
    demonstration answers: weights [H, T, T] -> [H]."""
    if not ex.answer:
        return np.zeros(weights.shape[0])
    return np.mean([weights[:, q, ex.demos[q]].sum(axis=-1) for q in ex.answer], axis=0)


def pick_view(run, ex: RecallExample, layer, visit, head) -> tuple[int, int, int]:
    """(layer, visit, head) to draw: the ones asked for where the model has them; where not
    given, the visit and head with the most demonstration-answer mass over the row."""
    schedule = list(run.schedule)
    if (layer, visit) not in schedule:
        if layer is not None and (layer, 0) in schedule:
            visit = 0
        else:
            layer, visit = max(schedule, key=lambda lv: demo_mass(run.pattern(*lv), ex).max())
    n_heads = run.pattern(layer, visit).shape[0]
    if head is None or not 0 <= head < n_heads:
        head = int(np.argmax(demo_mass(run.pattern(layer, visit), ex)))
    return int(layer), int(visit), int(head)


def token_view(ex: RecallExample, query: int | None) -> list[html.Span]:
    """The row's tokens, one span each, classed by what they are (see assets/case_study.css)."""
    answer, first = set(ex.answer), set(ex.first)
    demos = set(ex.demos.get(query, [])) if query is not None else set()
    spans = []
    for pos, label in enumerate(ex.labels):
        kinds = ["tok"]
        if pos == 0:
            kinds.append("tok-bos")
        if ex.ids[pos] in ex.trigger_ids:
            kinds.append("tok-trigger")
        if pos in answer:
            kinds.append("tok-answer")
        if pos in first:
            kinds.append("tok-first")
        if pos == query:
            kinds.append("tok-query")
        if pos in demos:
            kinds.append("tok-demo")
        spans.append(html.Span(label, className=" ".join(kinds), title=f"position {pos}"))
    return spans


def recall_view(wb: Workbench, model, row, layer, visit, head, query) -> tuple:
    """(note, tokens, attention figure, the view drawn: {layer, visit, head, query}) of
    held-out row `row` on `model`."""
    name = wb.registry.valid(model)
    ex = wb.recall_example(name, _int(row, 0, 0, 10**6))
    if not ex.answer:
        return (
            f"Row {ex.index} has no answer position (no trigger repeats); try another row.",
            token_view(ex, None),
            message_figure("no answer position in this row"),
            {},
        )
    try:
        run = wb.run(name, ex.text)
        layer, visit, head = pick_view(run, ex, layer, visit, head)
    except (PromptError, ProbeError) as exc:
        return str(exc), token_view(ex, None), message_figure(str(exc)), {}
    q = query if query in ex.demos else ex.answer[-1]
    weights = run.pattern(layer, visit)[head, q, : q + 1]
    answers = display_labels([ex.targets[p] for p in ex.answer])
    right = sum(run.next_token[p] == a for p, a in zip(ex.answer, answers))
    note = (
        f"{name}, layer {layer} visit {visit} head {head}, from answer position {q} "
        f"({ex.labels[q]}; answer {display_labels([ex.targets[q]])[0]!r}, predicted "
        f"{run.next_token[q]!r}). In this row the model predicts {right} of {len(ex.answer)} "
        f"answers right; mass on BOS here {weights[0]:.2f}, on the demonstration answers "
        f"{weights[ex.demos[q]].sum():.2f}."
    )
    figure = case_figs.answer_attention(
        weights,
        ex.labels,
        q,
        ex.demos[q],
        title=f"{name}: layer {layer}, visit {visit}, head {head}, from position {q}",
    )
    drawn = {"layer": layer, "visit": visit, "head": head, "query": q}
    return note, token_view(ex, q), figure, drawn


# ----- the Dyck example ----------------------------------------------------------------------
def _preview(ex) -> html.Pre:
    return html.Pre([ex.prompt, html.Mark(ex.answer)], className="dyck")


def _mass_line(who: str, bos, demo) -> html.Span:
    """'<who>: BOS a → b, demonstrations c → d': the answer positions' attention mass in visit
    0 → visit 1."""
    visits = lambda values: " → ".join(f"{v:.2f}" for v in values)  # noqa: E731
    return html.Span(
        [f"{who}: BOS ", html.B(visits(bos)), ", demonstrations ", html.B(visits(demo))]
    )


def results(wb: Workbench, text: str):
    """(completions panel, mass figure, paper figure, paper line, message, message style)."""
    try:
        cases = {n: wb.dyck_case(n, text) for n in wb.registry.names}
    except PromptError as exc:
        blank = message_figure(ui.NO_FIGURE)
        return (html.P("—", className="note"), blank, blank, "", *ui.show_message(str(exc)))
    ex = next(iter(cases.values())).example
    rows = [
        [
            html.B(n),
            html.Code(c.completion or "(nothing)", className="mono"),
            html.Code(ex.answer, className="mono"),
            html.Span(
                "right" if c.correct else "wrong", className=f"badge {'ok' if c.correct else 'bad'}"
            ),
        ]
        for n, c in cases.items()
    ]
    link = attention.PATH + urls.encode(
        ATTENTION_LINK, {"model": wb.registry.valid(None), "prompt": ex.text}
    )
    panel = html.Div(
        [
            ui.table(["model", "completion", "expected", ""], rows, class_name="completions"),
            html.H3("Full example", className="card-title", style={"marginTop": "14px"}),
            _preview(ex),
            html.P(
                [
                    f"{len(ex.ids)} tokens, {ex.n_demos} "
                    f"demonstration{'s' if ex.n_demos != 1 else ''}. ",
                    dcc.Link("Open it on the Attention page →", href=link),
                ],
                className="note",
            ),
        ]
    )
    frames = {n: c.visits for n, c in cases.items()}
    bos, demo = paper.DYCK_BOS_MASS, paper.DYCK_DEMO_MASS
    line = [_mass_line("paper (SMELT)", (bos.lo, bos.hi), (demo.lo, demo.hi))]
    for n, frame in frames.items():
        means = figs.loop_span_means(frame)
        line.append(_mass_line(f"ours ({n})", means["bos_mass"], means["demo_mass"]))
    return (
        panel,
        figs.mass_by_depth(frames),
        figs.paper_comparison(frames),
        line,
        *ui.show_message(None),
    )


# ----- callbacks ---------------------------------------------------------------------------
def register(app, wb: Workbench) -> None:
    @app.callback(
        Output("case-recall", "style"),
        Output("case-dyck", "style"),
        *CONTROLS.inputs("task"),
    )
    def _show(task):
        task = task_of(wb, task)
        return (SHOWN, HIDDEN) if task == "assoc_recall" else (HIDDEN, SHOWN)

    @app.callback(
        CONTROLS["n_demos"].output("options"),
        CONTROLS["n_demos"].output(),
        Output(ui.gid("case-aggregate"), "figure"),
        Output("case-aggregate-text", "children"),
        Output("case-aggregate-table", "children"),
        *CONTROLS.inputs("task", "n_demos", "load"),
    )
    def _aggregate(task, n_demos, _):
        task = task_of(wb, task)
        figure, lines, table, drawn = aggregate(wb, task, n_demos)
        counts = demo_counts(task_tables(wb, task), task) if drawn is not None else []
        options = [{"label": demo_label(task, n, counts[-1]), "value": n} for n in counts]
        return options, drawn, figure, lines, table

    @app.callback(
        Output(ui.gid("case-training"), "figure"),
        CONTROLS["seen"].output(),
        *CONTROLS.inputs("tick", "load"),
        *CONTROLS.states("seen"),
    )
    def _training(_, __, seen):
        drawn = training_signature(wb)
        if drawn == seen:
            return no_update, no_update
        return training_figure(wb), drawn

    @app.callback(
        CONTROLS["layer"].output("options"),
        CONTROLS["visit"].output("options"),
        CONTROLS["head"].output("options"),
        CONTROLS["query"].output("options"),
        *CONTROLS.inputs("model", "row"),
    )
    def _recall_options(model, row):
        if not wb.registry.names:
            return [], [], [], []
        return recall_options(wb, model, row)

    @app.callback(
        Output("recall-note", "children"),
        Output("recall-tokens", "children"),
        Output(ui.gid("recall-attention"), "figure"),
        *(CONTROLS[name].output() for name in VIEW),
        *CONTROLS.inputs("model", "row", *VIEW),
    )
    def _recall(model, row, layer, visit, head, query):
        """The drawn view, and the (layer, visit, head, answer position) it shows written back
        into the controls (the defaults, or the nearest the model has)."""
        if not wb.registry.names:
            return "", [], message_figure("no models"), *(no_update for _ in VIEW)
        view = recall_view(wb, model, row, layer, visit, head, query)
        return *view[:3], *(view[3].get(name, no_update) for name in VIEW)

    @app.callback(
        CONTROLS["text"].output(),
        CONTROLS["dyck"].output(allow_duplicate=True),
        Output("dyck-msg", "children", allow_duplicate=True),
        Output("dyck-msg", "style", allow_duplicate=True),
        Input("dyck-generate", "n_clicks"),
        *CONTROLS.states("pairs", "depth", "demos", "seed"),
        prevent_initial_call=True,
    )
    def _generate(_, pairs, depth, demos, seed):
        s = settings({"pairs": pairs, "depth": depth, "demos": demos, "seed": seed})
        try:
            text = generate_dyck(s["pairs"], s["depth"], s["demos"], s["seed"], wb.max_seq_len)
        except PromptError as exc:
            return (no_update, no_update, *ui.show_message(str(exc)))
        return text, text, *ui.show_message(None)

    ui.run_prompt_on_click(app, "dyck")

    @app.callback(
        Output("dyck-results", "children"),
        Output(ui.gid("dyck-mass"), "figure"),
        Output(ui.gid("dyck-paper-fig"), "figure"),
        Output("dyck-paper", "children"),
        Output("dyck-msg", "children"),
        Output("dyck-msg", "style"),
        *CONTROLS.inputs("dyck"),
    )
    def _results(text):
        return results(wb, text)

    # the URL keys in two writers, so that no callback request outgrows the guard's body cap
    # (http_hardening.MAX_REQUEST_BYTES) whatever its values: the case study's and the Dyck prompt's
    sources = CONTROLS.url_sources()
    for keys in URL_GROUPS:
        urls.write_to_url(app, QUERY, {key: sources[key] for key in keys})
