"""Attention: every head of one (layer, visit) as a grid, one head in focus with token labels,
and that head in each visit of a looped layer side by side."""

from __future__ import annotations

from functools import partial
from typing import Any

from dash import Input, Output, dcc, html, no_update

from smelt_interp.app import components as ui
from smelt_interp.app import urls
from smelt_interp.app import value_kinds as kind
from smelt_interp.app.controls import Control, Controls
from smelt_interp.app.default_prompts import default_prompt_for
from smelt_interp.app.figure_cache import FigureCache
from smelt_interp.app.pages import pattern_cap
from smelt_interp.app.prompt_run import cached_run, context_note
from smelt_interp.app.served import Served
from smelt_interp.data.prompt_text import IDS_SYNTAX
from smelt_interp.errors import PromptError
from smelt_interp.fields import is_int
from smelt_interp.figures import attention as figs
from smelt_interp.figures.theme import message_figure

PATH = "/attention"
TITLE = "Attention"
PROBES = ()  # the registered probes whose tables this page draws (none: one prompt's pass)
# the page's controls (the URL keys in URL order), declared once; QUERY and INPUTS follow
CONTROLS = Controls(
    model=Control("attn-model", "value", kind.NAME, url=str),
    layer=Control("attn-layer", "value", kind.INDEX, url=int),
    visit=Control("attn-visit", "value", kind.INDEX, url=int),
    head=Control("attn-head", "value", kind.INDEX, url=int),
    bos=Control("attn-bos", "value", kind.FLAGS, url=bool),
    prompt=Control("attn-applied", "data", kind.PROMPT, url=str),
    text=Control("attn-prompt", "value", kind.PROMPT),
)
QUERY: urls.Query = CONTROLS.query
INPUTS = CONTROLS.kinds


def default_layer(cfg) -> int:
    """The first looped layer (SMELT's loop_start), else the middle one."""
    looped = cfg.looped_layers
    return looped[0] if looped else cfg.n_layers // 2


def layer_options(cfg) -> tuple[list[int], list[str]]:
    layers = list(range(cfg.n_layers))
    return layers, [f"{layer} ↻" if cfg.visits_of(layer) > 1 else str(layer) for layer in layers]


def _within(value: Any, n: int, default: int) -> int:
    """`value` when it is an integer in 0..n-1, else `default`."""
    ok = is_int(value) and 0 <= value < n
    return value if ok else default


def place(cfg, layer: Any, visit: Any) -> tuple[int, int]:
    """(layer, visit) the model runs: an invalid layer becomes the default one, an invalid
    visit the layer's last."""
    layer = _within(layer, cfg.n_layers, default_layer(cfg))
    n_visits = cfg.visits_of(layer)
    return layer, _within(visit, n_visits, n_visits - 1)


def resolve(served: Served, state: dict) -> dict[str, Any]:
    """The page's selections from a URL state: invalid or missing values replaced by defaults
    (a looped layer, its last visit). A missing or invalid head stays None: its default, the
    head with most structure, needs the model's forward pass, which a page load never waits
    for (a callback picks it, `default_head`)."""
    model = served.registry.valid(state.get("model"))
    cfg = served.registry.cfg(model)
    layer, visit = place(cfg, state.get("layer"), state.get("visit"))
    prompt = state.get("prompt") or default_prompt_for(served, model)
    head = state.get("head")
    return {
        "model": model,
        "layer": layer,
        "visit": visit,
        "head": head if is_int(head) and 0 <= head < cfg.n_heads else None,
        "prompt": prompt,
        "bos": bool(state.get("bos", True)),
    }


def default_head(served: Served, model: str, layer: Any, visit: Any, prompt: str | None) -> int:
    """The head whose attention leaves BOS most in (layer, visit) on `prompt` (0 when the
    prompt cannot run): the head shown when none is chosen."""
    try:
        run = pattern_cap.capped(
            cached_run(served, model, prompt or default_prompt_for(served, model))
        )
    except PromptError:
        return 0
    layer, visit = place(served.registry.cfg(run.model), layer, visit)
    return run.structured_head(layer, visit)


def layout(served: Served, state: dict) -> html.Div:
    s = resolve(served, state)
    cfg = served.registry.cfg(s["model"])
    layers, layer_labels = layer_options(cfg)
    return html.Div(
        [
            ui.page_head(
                "Attention patterns",
                "Pick a model, layer, visit and head. A looped layer (↻) runs more than once "
                "(twice in SMELT): its visits have their own queries and keys and are shown side "
                "by side. Hover a cell for the query and key tokens; click a head in the grid to "
                "focus it.",
            ),
            ui.card(
                ui.prompt_box(
                    "attn", s["prompt"], rows=3, context=context_note(served, s["model"])
                ),
                ui.message("attn-msg"),
                html.Div(id="attn-info", className="note"),
                title="Prompt",
                subtitle="Any text; it starts with BOS. The default is a held-out example of the "
                "model's own task (in-context Dyck, or an associative-recall row), sized to its "
                f"context (a model folder without a tokenizer: a row of ids). {IDS_SYNTAX}",
            ),
            ui.card(
                html.Div(
                    [
                        ui.field(
                            "Model",
                            ui.radio(CONTROLS.id("model"), served.registry.names, s["model"]),
                        ),
                        ui.field(
                            "Layer",
                            ui.radio(CONTROLS.id("layer"), layers, s["layer"], layer_labels),
                        ),
                        ui.field(
                            "Visit",
                            ui.radio(
                                CONTROLS.id("visit"),
                                list(range(cfg.visits_of(s["layer"]))),
                                s["visit"],
                            ),
                        ),
                        ui.field(
                            "Head",
                            ui.radio(CONTROLS.id("head"), list(range(cfg.n_heads)), s["head"]),
                        ),
                        ui.field(
                            "Colour scale",
                            dcc.Checklist(
                                id=CONTROLS.id("bos"),
                                options=[{"label": "leave BOS out", "value": "skip"}],
                                value=["skip"] if s["bos"] else [],
                                className="check",
                            ),
                        ),
                    ],
                    className="controls",
                )
            ),
            html.Div(
                [
                    ui.card(ui.graph("attn-focus"), title="Focused head"),
                    ui.card(ui.graph("attn-grid"), title="All heads of this layer and visit"),
                ],
                className="grid-focus",
            ),
            ui.card(
                ui.graph("attn-visits"),
                title="This head in each visit",
                subtitle="Same colour scale for both visits.",
            ),
        ]
    )


def register_choices(app, served: Served) -> None:
    """The layer, visit and head options follow the model and the layer."""
    layer, head, visit = CONTROLS["layer"], CONTROLS["head"], CONTROLS["visit"]

    @app.callback(
        layer.output("options"),
        layer.output(),
        head.output("options"),
        head.output(allow_duplicate=True),
        *CONTROLS.inputs("model"),
        *CONTROLS.states("layer", "head"),
        prevent_initial_call=True,
    )
    def _model_changed(model, layer, head):
        cfg = served.registry.cfg(served.registry.valid(model))
        layers, labels = layer_options(cfg)
        layer = layer if layer in layers else default_layer(cfg)
        heads = list(range(cfg.n_heads))
        return (
            [{"label": lab, "value": v} for v, lab in zip(layers, labels)],
            layer,
            [{"label": str(h), "value": h} for h in heads],
            head if head in heads else 0,
        )

    @app.callback(
        visit.output("options"),
        visit.output(),
        *CONTROLS.inputs("model", "layer"),
        *CONTROLS.states("visit"),
        prevent_initial_call=True,
    )
    def _layer_changed(model, layer, visit):
        cfg = served.registry.cfg(served.registry.valid(model))
        layer, visit = place(cfg, layer, visit)
        return [{"label": str(v), "value": v} for v in range(cfg.visits_of(layer))], visit


def register(app, served: Served) -> None:
    head = CONTROLS["head"]
    figures = FigureCache(served.registry)  # the grid and focus answers, shared between users
    register_choices(app, served)

    ui.run_prompt_on_click(app, "attn")
    ui.context_follows_model(app, "attn", CONTROLS["model"].input, partial(context_note, served))

    @app.callback(
        head.output(),
        *CONTROLS.inputs("model", "layer", "visit", "prompt"),
        *CONTROLS.states("head"),
    )
    def _default_head(model, layer, visit, prompt, chosen):
        """The head with most structure, when the page was laid out with none chosen."""
        cfg = served.registry.cfg(served.registry.valid(model))
        if is_int(chosen) and 0 <= chosen < cfg.n_heads:
            return no_update
        return default_head(served, model, layer, visit, prompt)

    @app.callback(
        head.output(allow_duplicate=True),
        Input(ui.gid("attn-grid"), "clickData"),
        prevent_initial_call=True,
    )
    def _grid_click(click):
        if not click or not click.get("points"):
            return no_update
        return int(click["points"][0]["curveNumber"])

    # The grid does not depend on the head, so a head change redraws only the focused head
    # and its visits; both callbacks read the same cached forward pass.
    @app.callback(
        Output(ui.gid("attn-grid"), "figure"),
        Output("attn-msg", "children"),
        Output("attn-msg", "style"),
        *CONTROLS.inputs("model", "layer", "visit", "bos", "prompt"),
    )
    def _grid(model, layer, visit, bos, prompt):
        inputs = (model, layer, visit, bool(bos), prompt)
        return figures.answer("grid", inputs, lambda: grid_figure(served, *inputs))

    @app.callback(
        Output(ui.gid("attn-focus"), "figure"),
        Output(ui.gid("attn-visits"), "figure"),
        Output("attn-info", "children"),
        *CONTROLS.inputs(),
    )
    def _focus(model, layer, visit, head, bos, prompt):
        inputs = (model, layer, visit, head, bool(bos), prompt)
        return figures.answer("focus", inputs, lambda: focus_figures(served, *inputs))

    urls.write_to_url(app, QUERY, CONTROLS.url_sources())


def grid_figure(served: Served, model: str, layer: int, visit: int, skip_bos: bool, prompt: str):
    """(grid, message, message style): every head of (layer, visit), or the prompt's error."""
    try:
        run = pattern_cap.capped(cached_run(served, model, prompt))  # what one response may carry
    except PromptError as exc:
        return (message_figure(ui.NO_FIGURE), *ui.show_message(str(exc)))
    layer, visit = place(served.registry.cfg(run.model), layer, visit)
    n_heads = served.registry.cfg(run.model).n_heads
    grid = figs.head_grid(
        run.pattern(layer, visit),
        run.labels,
        skip_bos=skip_bos,
        cols=1 if n_heads <= 2 else 2,
        title=f"{run.model} · layer {layer} · visit {visit}",
    )
    return (grid, *ui.show_message(None))


def focus_figures(
    served: Served, model: str, layer: int, visit: int, head: int, skip_bos: bool, prompt: str
):
    """(focused head, the head in each visit, info line)."""
    try:
        run = pattern_cap.capped(cached_run(served, model, prompt))  # what one response may carry
    except PromptError:
        blank = message_figure(ui.NO_FIGURE)
        return blank, blank, ""
    cfg = served.registry.cfg(run.model)
    layer, visit = place(cfg, layer, visit)
    if not (is_int(head) and 0 <= head < cfg.n_heads):
        head = run.structured_head(layer, visit)
    pats = run.pattern(layer, visit)
    focus = figs.head_heatmap(
        pats[head],
        run.labels,
        skip_bos=skip_bos,
        title=f"{run.model} · layer {layer} · visit {visit} · head {head}",
    )
    if cfg.visits_of(layer) > 1:
        pair = figs.visit_pair(
            {v: run.pattern(layer, v)[head] for v in range(cfg.visits_of(layer))},
            run.labels,
            skip_bos=skip_bos,
            title=f"{run.model} · layer {layer} · head {head}",
        )
    else:
        pair = message_figure(
            f"layer {layer} of {run.model} runs once; pick a looped layer (↻) to compare visits"
        )
    return focus, pair, sink_line(run, cfg, layer, visit, head)


def sink_line(run, cfg, layer: int, visit: int, head: int) -> str:
    """The focused head's mass on BOS (the first token where the model adds none) and, for a
    model with learned sinks, on its sink slot (1 minus the row's sum) beside it."""
    bos = run.bos_share(layer, visit)[head]
    if cfg.first_token_id is None:
        where, after = "the first token (the model adds no BOS)", "the first"
    else:
        where, after = "BOS", "BOS"
    slot = ""
    if cfg.learned_sinks:
        slot = f" and {run.slot_share(layer, visit)[head]:.0%} on its learned sink"
    mean = float(run.bos_share(layer, visit).mean())
    return (
        f"{run.n_tokens} tokens. Head {head} puts {bos:.0%} of its attention on {where}{slot} "
        f"(mean over queries after {after}); all {cfg.n_heads} heads of layer {layer}, visit "
        f"{visit}: {mean:.0%}."
    )


def figures(
    served: Served, model: str, layer: int, visit: int, head: int, skip_bos: bool, prompt: str
):
    """Everything the page draws: (focus, grid, visits, message, message style, info)."""
    grid, msg, style = grid_figure(served, model, layer, visit, skip_bos, prompt)
    focus, pair, info = focus_figures(served, model, layer, visit, head, skip_bos, prompt)
    return focus, grid, pair, msg, style, info
