"""The case study's recall example: one held-out row of in-context associative recall
(data.assoc_recall) with its triggers, answer positions and demonstration answers marked; first
the paper's quantity on it for every served model that reads its tokens (answer-position masses
per (layer, visit) as head means with the best head, uniform attention's levels beside them,
models trained on another task marked), then one head's attention from an answer position;
where the URL names no layer, visit or head, the ones with the most mass on the demonstration
answers."""

from __future__ import annotations

import numpy as np
from dash import Output, html, no_update

from smelt_interp.app import components as ui
from smelt_interp.app import value_kinds as kind
from smelt_interp.app.controls import Control, Controls
from smelt_interp.app.figure_cache import FigureCache
from smelt_interp.app.pages.case_study.quantity import levels_text, quantity_table
from smelt_interp.app.pages.case_study.task import ids_only_note
from smelt_interp.app.pages.case_study.widgets import clamp, dropdown, number_box
from smelt_interp.app.prompt_run import cached_run
from smelt_interp.app.served import Served, provenance_of, shortest_context, text_models
from smelt_interp.data.prompt_text import display_labels
from smelt_interp.data.recall_example import RecallExample, recall_example
from smelt_interp.errors import ProbeError, PromptError
from smelt_interp.figures import case_study as case_figs
from smelt_interp.figures.theme import message_figure
from smelt_interp.measure.levels import answer_levels
from smelt_interp.measure.position_mass import (
    key_set_masses,
    pattern_answer_masses,
    prompt_set_mass,
)
from smelt_interp.provenance import TASK_RECALL

CONTROLS = Controls(
    row=Control("recall-row", "value", kind.NUMBER, url=int),
    model=Control("recall-model", "value", kind.NAME, url=str),
    layer=Control("recall-layer", "value", kind.INDEX, url=int),
    visit=Control("recall-visit", "value", kind.INDEX, url=int),
    head=Control("recall-head", "value", kind.INDEX, url=int),
    query=Control("recall-query", "value", kind.INDEX, url=int),
)
VIEW = ("layer", "visit", "head", "query")  # the view drawn, chosen or defaulted
# The row length posed to a model that never trained recall: the demo recall pair's. Its own
# context would be far too long to draw (SmolLM2's 8,192 tokens: 9 x 8,192^2 weights a layer).
UNTRAINED_ROW_LEN = 128


def recall_row(served: Served, model: str, index: int) -> RecallExample:
    """Held-out assoc_recall row `index` on the task spec and row length `model` trained on (a
    CheckpointError for a recall checkpoint that records no spec), kept per model version: the
    row's draw is shared by concurrent requests for it and kept for the next."""
    name = served.registry.valid(model)

    def build() -> RecallExample:
        provenance = provenance_of(served, name)
        longest = shortest_context(served)
        trained = provenance.row_len(TASK_RECALL) or UNTRAINED_ROW_LEN
        length = max(2, min(trained, longest))
        return recall_example(index, provenance.recall_spec, length)

    return served.recall_rows.get_or_compute((name, served.registry.version(name), index), build)


def layout(served: Served, state: dict) -> list:
    """One held-out row with its controls, its tokens marked and one head's attention."""
    names = served.registry.names
    model = recall_model(served, state.get("model")) if names else None
    row = clamp(state.get("row"), 0, 0, 10**6)
    controls = [
        ui.field("Held-out row", number_box(CONTROLS["row"], row, 0, 10**6)),
        ui.field("Model", ui.radio(CONTROLS.id("model"), list(names), model)),
        ui.field("Layer", ui.radio(CONTROLS.id("layer"), [], state.get("layer"))),
        ui.field("Visit", ui.radio(CONTROLS.id("visit"), [], state.get("visit"))),
        ui.field("Head", ui.radio(CONTROLS.id("head"), [], state.get("head"))),
        ui.field("Answer position", dropdown(CONTROLS["query"], state.get("query"))),
    ]
    return [
        ui.card(
            html.Div(controls, className="controls"),
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
            html.H3("This row: where the answer positions look", className="case-h3"),
            html.Div(id="recall-quantity", className="case-table"),
            html.H3("One head, from one answer position", className="case-h3"),
            html.Div(id="recall-note", className="note"),
            ui.graph("recall-attention"),
            title="One held-out row",
            subtitle="A row of the associative-recall task (never seen in training): bigram "
            "filler, triggers T0, T1, ... each followed by the successor it keeps for the "
            "whole row. At an answer position (a trigger seen before) the model can read the "
            "answer from the demonstration answers: the tokens after the trigger's earlier "
            "occurrences. With a single trigger (the demo's recall pair) that is attending "
            "to the token after the trigger's earlier occurrences, not content-addressed "
            "recall among several keys. First, per (layer, visit), the mass from this row's "
            "answer positions on BOS and on their demonstration answers, as the mean over "
            "heads with the best head beside it, for every served model (those trained on "
            "another task see rows like this for the first time, and are marked so). Then one "
            "head's attention; defaults: the layer, visit and head with the most mass on the "
            "demonstration answers.",
        )
    ]


def recall_model(served: Served, model) -> str:
    """`model` if served, else the default: the first looped model that reads text (a model
    folder without a tokenizer is posed no recall row), else the registry's default."""
    if model in served.registry.names:
        return model
    text = text_models(served)
    looped = [n for n in text if served.registry.cfg(n).is_looped]
    return (looped or text or [served.registry.valid(None)])[0]


def recall_options(served: Served, model: str, row) -> tuple[list, list, list, list]:
    """(layer, visit, head, answer-position) options for `model` on held-out row `row`."""
    name = recall_model(served, model)
    cfg = served.registry.cfg(name)
    ex = recall_row(served, name, clamp(row, 0, 0, 10**6))
    visits = sorted({v for _, v in served.registry.get(name).schedule})
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
    return prompt_set_mass(weights, ex.answer, ex.demos)


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


def recall_view(served: Served, model, row, layer, visit, head, query) -> tuple:
    """(note, tokens, attention figure, the view drawn: {layer, visit, head, query}) of
    held-out row `row` on `model`."""
    name = recall_model(served, model)
    ex = recall_row(served, name, clamp(row, 0, 0, 10**6))
    if name not in text_models(served):
        why = ids_only_note(served) or name
        return why, token_view(ex, None), message_figure(why), {}
    if not ex.answer:
        return (
            f"Row {ex.index} has no answer position (no trigger repeats); try another row.",
            token_view(ex, None),
            message_figure("no answer position in this row"),
            {},
        )
    try:
        run = cached_run(served, name, ex.text)
        if run.ids != ex.ids:  # a recall row is bytes: another tokenizer has other positions
            raise ProbeError(
                f"{name}'s tokenizer reads this row as {len(run.ids)} tokens, not the row's "
                f"{len(ex.ids)} bytes, so its answer positions are not the row's"
            )
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
        f"{key_set_masses(weights, {'demos': ex.demos[q]})['demos']:.2f}."
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


def row_quantity(served: Served, model, row) -> list:
    """The paper's quantity on held-out row `row` (drawn from `model`'s recall spec) for every
    served model whose tokenizer reads the row as the same tokens."""
    name = recall_model(served, model)
    ex = recall_row(served, name, clamp(row, 0, 0, 10**6))
    if not ex.answer:
        return [html.P(f"Row {ex.index} has no answer position.", className="note")]
    heads, unread = {}, []
    for other in text_models(served):  # a model without a tokenizer: ids_only_note says why
        try:
            run = cached_run(served, other, ex.text)
        except PromptError:
            unread.append(other)
            continue
        if run.ids != ex.ids:
            unread.append(other)
            continue
        patterns = {lv: run.pattern(*lv) for lv in run.schedule}
        heads[other] = pattern_answer_masses(patterns, ex.answer, ex.demos)
    trained = {n: provenance_of(served, n).task == TASK_RECALL for n in heads}
    out: list = [
        html.P(
            f"Over the row's {len(ex.answer)} answer positions; "
            + levels_text(answer_levels(ex.answer, ex.demos)),
            className="paper-line",
        ),
        quantity_table(heads, trained),
    ]
    if unread:
        out.append(
            html.P(f"Not shown (their tokenizer reads the row otherwise): {', '.join(unread)}")
        )
    return out


def register(app, served: Served) -> None:
    figures = FigureCache(served.registry)  # answers per (model, row, view), shared by users

    @app.callback(Output("recall-quantity", "children"), *CONTROLS.inputs("model", "row"))
    def _quantity(model, row):
        if not served.registry.names:
            return []
        return figures.answer(
            "recall-quantity", [model, row], lambda: row_quantity(served, model, row)
        )

    @app.callback(
        CONTROLS["layer"].output("options"),
        CONTROLS["visit"].output("options"),
        CONTROLS["head"].output("options"),
        CONTROLS["query"].output("options"),
        *CONTROLS.inputs("model", "row"),
    )
    def _recall_options(model, row):
        if not served.registry.names:
            return [], [], [], []
        return figures.answer(
            "recall-options", [model, row], lambda: recall_options(served, model, row)
        )

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
        if not served.registry.names:
            return "", [], message_figure("no models"), *(no_update for _ in VIEW)
        inputs = [model, row, layer, visit, head, query]
        view = figures.answer(
            "recall-view",
            inputs,
            lambda: recall_view(served, model, row, layer, visit, head, query),
        )
        return *view[:3], *(view[3].get(name, no_update) for name in VIEW)
