"""The case study's Dyck example: a prompt to build or type (held-out bracket prefixes, the
last the query), both models' completions, and their answer positions' attention mass per
visit: first per (layer, visit) as the mean over heads with the best head beside it and uniform
attention's levels on the same positions, then by depth and beside the paper's loop-span
values."""

from __future__ import annotations

from dash import Input, Output, dcc, html, no_update

from smelt_interp import paper
from smelt_interp.app import components as ui
from smelt_interp.app import urls
from smelt_interp.app import value_kinds as kind
from smelt_interp.app.controls import Control, Controls
from smelt_interp.app.figure_cache import FigureCache
from smelt_interp.app.pages import attention
from smelt_interp.app.pages.case_study.quantity import (
    levels_text,
    quantity_table,
)
from smelt_interp.app.pages.case_study.recall import recall_model
from smelt_interp.app.pages.case_study.task import ids_only_note
from smelt_interp.app.pages.case_study.widgets import clamp, number_box
from smelt_interp.app.served import Served, provenance_of, shortest_context, text_models
from smelt_interp.data.dyck import dyck_batch
from smelt_interp.data.dyck_text import dyck_example, generate_dyck
from smelt_interp.errors import PromptError
from smelt_interp.figures import dyck as figs
from smelt_interp.figures.theme import message_figure
from smelt_interp.measure.case_positions import dyck_case
from smelt_interp.measure.levels import case_levels
from smelt_interp.probes.dyck_prompt import DyckCase, run_dyck_prompt
from smelt_interp.provenance import TASK_DYCK

CONTROLS = Controls(
    pairs=Control("dyck-pairs", "value", kind.NUMBER, url=int),
    depth=Control("dyck-depth", "value", kind.NUMBER, url=int),
    demos=Control("dyck-demos", "value", kind.NUMBER, url=int),
    seed=Control("dyck-seed", "value", kind.NUMBER, url=int),
    dyck=Control("dyck-applied", "data", kind.PROMPT, url=str),
    text=Control("dyck-prompt", "value", kind.PROMPT),
)
# the Attention page's keys that "Open it on the Attention page" sets
ATTENTION_LINK: urls.Query = {key: attention.QUERY[key] for key in ("model", "prompt")}
NO_MESSAGE = ui.show_message(None)
DEFAULT_DYCK = {"pairs": 4, "depth": 4, "demos": 2, "seed": 0}


def cached_case(served: Served, model: str, text: str) -> DyckCase:
    """`model` on the page's Dyck prompt `text` (its completion and masses), once per model
    version and text (served.dyck), the model held while it runs."""
    registry = served.registry

    def compute() -> DyckCase:
        tokenizer = registry.tokenizer(model)
        ex = dyck_example(text, registry.cfg(model).max_seq_len, tokenizer)
        with registry.using(model) as m:
            return run_dyck_prompt(m, model, ex, tokenizer)

    return served.dyck.get_or_compute((model, registry.version(model), text), compute)


def settings(state: dict) -> dict[str, int]:
    d = DEFAULT_DYCK
    return {
        "pairs": clamp(state.get("pairs"), d["pairs"], 1, 4),
        "depth": clamp(state.get("depth"), d["depth"], 1, 10),
        "demos": clamp(state.get("demos"), d["demos"], 0, 8),
        "seed": clamp(state.get("seed"), d["seed"], 0, 10**9),
    }


def layout(served: Served, state: dict) -> list:
    """The prompt with its completions, and where the answer looks."""
    s = settings(state)
    text = state.get("dyck")
    if not text:
        try:
            text = generate_dyck(
                s["pairs"], s["depth"], s["demos"], s["seed"], shortest_context(served)
            )
        except PromptError:
            text = "( [ {"
    prompt = ui.card(
        html.Div(
            [
                ui.field("Bracket pairs", ui.radio(CONTROLS.id("pairs"), [1, 2, 3, 4], s["pairs"])),
                ui.field("Max depth", number_box(CONTROLS["depth"], s["depth"], 1, 10)),
                ui.field("Demonstrations", number_box(CONTROLS["demos"], s["demos"], 0, 8)),
                ui.field("Seed", number_box(CONTROLS["seed"], s["seed"], 0, 10**9)),
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
                context=f"The served models read at most {shortest_context(served)} tokens, "
                "BOS included.",
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
            html.Div(id="dyck-quantity", className="case-table"),
            ui.graph("dyck-mass"),
            title="Where the answer looks",
            subtitle="Attention from the positions that predict the answer, per (layer, "
            "visit): the mean over heads (the paper's quantity) with the best head beside it, "
            "and what uniform attention would put on the same keys; then the head means by "
            "effective depth. Models trained on another task are marked.",
        ),
        ui.card(
            html.Div(id="dyck-paper", className="paper-line"),
            ui.graph("dyck-paper-fig"),
            title="Loop span, visit 0 vs visit 1, beside the paper",
            subtitle="Means over the looped layers (for a Baseline: the layers the recipe "
            "would loop) for this one prompt; the paper averages many.",
        ),
    ]


def _preview(ex) -> html.Pre:
    return html.Pre([ex.prompt, html.Mark(ex.answer)], className="dyck")


def _mass_line(who: str, bos, demo) -> html.Span:
    """'<who>: BOS a → b, demonstrations c → d': the answer positions' attention mass in visit
    0 → visit 1."""
    visits = lambda values: " → ".join(f"{v:.2f}" for v in values)  # noqa: E731
    return html.Span(
        [f"{who}: BOS ", html.B(visits(bos)), ", demonstrations ", html.B(visits(demo))]
    )


def results(served: Served, text: str):
    """(completions panel, mass figure, paper figure, paper line, message, message style)."""
    if not text_models(served):  # no served model reads text: nothing to pose, and no error
        blank = message_figure(ids_only_note(served) or "no models")
        return (html.P(ids_only_note(served), className="note"), blank, blank, "", *NO_MESSAGE)
    try:
        cases = {n: cached_case(served, n, text) for n in text_models(served)}
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
    # on a model that reads the prompt's text (not a model folder without a tokenizer)
    shown = {"model": recall_model(served, None), "prompt": ex.text}
    link = attention.PATH + urls.encode(ATTENTION_LINK, shown)
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


def quantity_view(served: Served, text: str) -> list:
    """The paper's quantity on this prompt for every served model, with uniform attention's
    levels on its answer positions."""
    if not text_models(served):
        return []
    try:
        cases = {n: cached_case(served, n, text) for n in text_models(served)}
    except PromptError:
        return []
    ex = next(iter(cases.values())).example
    tokens, lengths = dyck_batch([ex])
    levels = case_levels(dyck_case([ex], tokens, lengths))
    at = levels[levels["n_demos"] == ex.n_demos]
    shown = {"uniform_bos": at["uniform_bos"].iloc[0], "demo_share": at["demo_share"].iloc[0]}
    heads = {n: c.heads for n, c in cases.items() if c.heads is not None}
    trained = {n: provenance_of(served, n).task == TASK_DYCK for n in heads}
    return [
        html.P(levels_text(shown) if len(at) else "", className="paper-line"),
        quantity_table(heads, trained),
    ]


def register(app, served: Served) -> None:
    figures = FigureCache(served.registry)  # answers per prompt and served models, shared by users

    @app.callback(Output("dyck-quantity", "children"), CONTROLS["dyck"].input)
    def _quantity(text):
        return figures.answer("dyck-quantity", [text], lambda: quantity_view(served, text))

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
            text = generate_dyck(
                s["pairs"], s["depth"], s["demos"], s["seed"], shortest_context(served)
            )
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
        CONTROLS["dyck"].input,
    )
    def _results(text):
        return figures.answer("dyck-results", [text], lambda: results(served, text))
