"""Routing: how many experts the two visits of a looped layer share per token (against
chance), expert usage per visit, and one chosen token's experts and weights in every visit. A
model with a dense feed-forward (an adapted hrm_text or dory) has no router: its views say so."""

from __future__ import annotations

from functools import partial

from dash import Output, dcc, html

from smelt_interp import paper
from smelt_interp.app import components as ui
from smelt_interp.app import urls
from smelt_interp.app import value_kinds as kind
from smelt_interp.app.controls import Control, Controls
from smelt_interp.app.default_prompts import default_prompt_for
from smelt_interp.app.figure_cache import FigureCache
from smelt_interp.app.probe_tables import batch_description, model_tables, probe_tables
from smelt_interp.app.prompt_run import cached_run, context_note, prompt_labels
from smelt_interp.app.served import Served
from smelt_interp.data.prompt_text import IDS_SYNTAX
from smelt_interp.errors import PromptError
from smelt_interp.fields import is_int
from smelt_interp.figures import loop as figs
from smelt_interp.figures.theme import message_figure
from smelt_interp.probes.registry import get

PATH = "/routing"
TITLE = "Routing"
PROBES = ("routing",)  # the registered probes whose tables this page draws
# the paper's experts shared per token by two visits, "2-3 of k = 8"
SHARED = f"{paper.ROUTING_OVERLAP.lo:g}-{paper.ROUTING_OVERLAP.hi:g} of k = {paper.ROUTING_K}"
# the page's controls (the URL keys in URL order), declared once; QUERY and INPUTS follow
CONTROLS = Controls(
    model=Control("routing-model", "value", kind.NAME, url=str),
    token=Control("routing-token", "value", kind.INDEX, url=int),
    prompt=Control("routing-applied", "data", kind.PROMPT, url=str),
    text=Control("routing-prompt", "value", kind.PROMPT),
    load=Control("routing-load", "data", kind.ANY),  # a trigger: the page has appeared
)
QUERY: urls.Query = CONTROLS.query
INPUTS = CONTROLS.kinds


def token_options(labels: list[str]) -> list[dict]:
    return [{"label": f"{i} · {lab}", "value": i} for i, lab in enumerate(labels)]


def dense_note(served: Served, model: str) -> str | None:
    """Why `model` has no routing to draw (a dense feed-forward), or None when it routes."""
    cfg = served.registry.cfg(model)
    if cfg.n_experts > 1:
        return None
    return f"{model} has no routed experts (a dense feed-forward): there is no routing to compare"


def layout(served: Served, state: dict) -> html.Div:
    model = served.registry.valid(state.get("model"))
    prompt = state.get("prompt") or default_prompt_for(served, model)
    try:
        labels = prompt_labels(served, model, prompt)  # the tokenizer's work only, no forward pass
    except PromptError:
        labels = []
    token = state.get("token")
    token = token if is_int(token) and 0 <= token < len(labels) else max(0, len(labels) - 1)
    return html.Div(
        [
            ui.page_head(
                "Expert routing",
                "Does a token go to the same experts on both visits of a looped layer? The overlap "
                "counts the experts two consecutive visits' top-k sets share; chance is "
                "sum_e k² u0(e) u1(e) from the two visits' measured expert usage.",
            ),
            ui.card(
                html.Div(
                    [
                        ui.field(
                            "Model", ui.radio(CONTROLS.id("model"), served.registry.names, model)
                        )
                    ],
                    className="controls",
                )
            ),
            html.Div(
                [
                    ui.card(
                        ui.graph("routing-overlap"),
                        dcc.Store(id=CONTROLS.id("load"), data=0),
                        title="Routing overlap per looped layer",
                        subtitle=f"On {batch_description(served)}. The paper finds {SHARED} "
                        "experts shared (of a top-8: beside another k it is not a like quantity).",
                    ),
                    ui.card(
                        ui.graph("routing-usage"),
                        title="Expert usage per visit",
                        subtitle="Share of routed slots each expert takes, per (layer, visit) "
                        "in execution order.",
                    ),
                ],
                className="grid-2",
            ),
            ui.card(
                ui.prompt_box("routing", prompt, rows=3, context=context_note(served, model)),
                ui.message("routing-msg"),
                html.Div(
                    ui.field(
                        "Token",
                        dcc.Dropdown(
                            id=CONTROLS.id("token"),
                            options=token_options(labels),
                            value=token,
                            clearable=False,
                            className="token-dd",
                        ),
                    ),
                    style={"maxWidth": "360px", "marginTop": "12px"},
                ),
                ui.graph("routing-token-fig"),
                title="One token's experts in each visit",
                subtitle="Rows follow execution order; each cell is the router's renormalised "
                f"weight on that expert (blank: not chosen). {IDS_SYNTAX}",
            ),
        ]
    )


def register(app, served: Served) -> None:
    figures = FigureCache(served.registry)  # the page's answers, shared between users

    @app.callback(Output(ui.gid("routing-overlap"), "figure"), *CONTROLS.inputs("load"))
    def _overlap(_):
        return figures.answer("overlap", (), lambda: overlap_figure(served))

    @app.callback(Output(ui.gid("routing-usage"), "figure"), *CONTROLS.inputs("model"))
    def _usage(model):
        return figures.answer("usage", (model,), lambda: usage_figure(served, model))

    ui.run_prompt_on_click(app, "routing")
    ui.context_follows_model(app, "routing", CONTROLS["model"].input, partial(context_note, served))

    @app.callback(
        CONTROLS["token"].output("options"),
        CONTROLS["token"].output(),
        *CONTROLS.inputs("model", "prompt"),
        *CONTROLS.states("token"),
        prevent_initial_call=True,
    )
    def _tokens(model, prompt, token):
        try:
            labels = prompt_labels(served, model, prompt)
        except PromptError:
            return [], None
        token = token if is_int(token) and 0 <= token < len(labels) else len(labels) - 1
        return token_options(labels), token

    @app.callback(
        Output(ui.gid("routing-token-fig"), "figure"),
        Output("routing-msg", "children"),
        Output("routing-msg", "style"),
        *CONTROLS.inputs(),
    )
    def _token(model, token, prompt):
        inputs = (model, token, prompt)
        return figures.answer("token", inputs, lambda: token_figure(served, *inputs))

    urls.write_to_url(app, QUERY, CONTROLS.url_sources())


def overlap_figure(served: Served):
    """The routing probe's overlap per looped layer, every served model that has one."""
    frames = {n: t["overlap"] for n, t in probe_tables(served, get("routing")).items()}
    names = served.registry.names
    if not frames and all(dense_note(served, n) for n in names):
        return message_figure(
            f"no routed experts: {', '.join(names)} "
            f"{'has a' if len(names) == 1 else 'have'} dense feed-forward"
            f"{'' if len(names) == 1 else 's'}, so there is no routing to compare"
        )
    return figs.routing_overlap(frames)


def usage_figure(served: Served, model: str | None):
    """`model`'s expert usage per visit, or why a flat model has none to compare."""
    model = served.registry.valid(model)
    if dense_note(served, model):
        return message_figure(dense_note(served, model))
    tables = model_tables(served, "routing", model)
    if tables is None:
        return message_figure(f"{model} is not looped: pick a SMELT model to compare its visits")
    return figs.expert_usage(tables["usage"], title=model)


def token_figure(served: Served, model: str | None, token, prompt: str | None):
    """(one token's experts in each visit, message, message style)."""
    try:
        run = cached_run(served, model, prompt)
    except PromptError as exc:
        return message_figure(ui.NO_FIGURE), *ui.show_message(str(exc))
    token = token if is_int(token) and 0 <= token < run.n_tokens else run.n_tokens - 1
    cfg = served.registry.cfg(run.model)
    if dense_note(served, run.model):
        return message_figure(dense_note(served, run.model)), *ui.show_message(None)
    title = (
        f"{run.model} · token {token} “{run.labels[token]}” (predicts “{run.next_token[token]}”)"
    )
    return (
        figs.token_routing(run.schedule, *run.routing(token), cfg.n_experts, title=title),
        *ui.show_message(None),
    )
