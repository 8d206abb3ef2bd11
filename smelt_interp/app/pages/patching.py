"""Patching: which (layer, visit, head) carries the answer of a prompt pair. Activation patching
of every head's z (or q, k, v) at every visit, clean -> corrupted, as a (layer x visit) by head
heatmap, and its first-order estimate (attribution patching) against it, node by node. The pair
is the model's task pair (a changed bracket or key) or the user's own two prompts of equal
length; the numbers come from measure.patch_tables, called directly."""

from __future__ import annotations

from typing import Any

from dash import Output, dcc, html

from smelt_interp.app import components as ui
from smelt_interp.app import urls
from smelt_interp.app import value_kinds as kind
from smelt_interp.app.controls import Control, Controls
from smelt_interp.app.figure_cache import FigureCache
from smelt_interp.app.served import Served
from smelt_interp.data.patch_pairs import PAIR_KINDS
from smelt_interp.errors import SmeltError
from smelt_interp.figures import patching as figs
from smelt_interp.figures.theme import message_figure
from smelt_interp.measure.patch_tables import headline, patching_cost, side_by_side
from smelt_interp.measure.patching import HEAD_SITES, METRICS, nodes_of
from smelt_interp.probes.patching import PairRequest, request_pair

PATH = "/patching"
TITLE = "Patching"
PROBES = ("patching",)  # the registered probe this page draws, for any pair the user picks
OWN = "own"  # the pair choice that reads the two prompt boxes
PAIRS = ("task", *PAIR_KINDS, OWN)
COLUMNS = ("activation", "attribution")
# Activation patching the page runs unasked, in parameter-token products (patching_cost): the
# default Dyck SMELT (1.8M parameters, about 40 heads, 8 rows of about 150 bytes) about 1e11,
# seconds; SmolLM2-135M's Dyck pair 1.2e13 (270 heads, 8 rows of 41 tokens), minutes of CPU
# for one view, which the command runs instead while the page draws attribution alone
PAGE_COST = 1e12
CONTROLS = Controls(
    model=Control("patch-model", "value", kind.NAME, url=str),
    pair=Control("patch-pair", "value", kind.choice(*PAIRS), url=str),
    metric=Control("patch-metric", "value", kind.choice(*METRICS), url=str),
    site=Control("patch-site", "value", kind.choice(*HEAD_SITES), url=str),
    column=Control("patch-column", "value", kind.choice(*COLUMNS), url=str),
    clean=Control("patch-clean", "value", kind.PROMPT, url=str),
    corrupt=Control("patch-corrupt", "value", kind.PROMPT, url=str),
)
QUERY: urls.Query = CONTROLS.query
INPUTS = CONTROLS.kinds


def _pick(value: Any, options: tuple[str, ...], default: str) -> str:
    return value if value in options else default


def resolve(served: Served, state: dict) -> dict[str, Any]:
    """The page's selections from a URL state, invalid values replaced by defaults."""
    return {
        "model": served.registry.valid(state.get("model")),
        "pair": _pick(state.get("pair"), PAIRS, "task"),
        "metric": _pick(state.get("metric"), METRICS, METRICS[0]),
        "site": _pick(state.get("site"), HEAD_SITES, "z"),
        "column": _pick(state.get("column"), COLUMNS, COLUMNS[0]),
        "clean": state.get("clean") if isinstance(state.get("clean"), str) else "",
        "corrupt": state.get("corrupt") if isinstance(state.get("corrupt"), str) else "",
    }


def _text_box(name: str, value: str, placeholder: str) -> dcc.Input:
    return dcc.Input(
        id=CONTROLS.id(name), value=value, placeholder=placeholder, debounce=True,
        className="text-input", style={"width": "100%"},
    )  # fmt: skip


def layout(served: Served, state: dict) -> html.Div:
    s = resolve(served, state)
    choice = lambda name, options: ui.radio(CONTROLS.id(name), list(options), s[name])  # noqa: E731
    controls = [
        ui.field("Model", ui.radio(CONTROLS.id("model"), served.registry.names, s["model"])),
        ui.field("Prompt pair", choice("pair", PAIRS)),
        ui.field("Metric", choice("metric", METRICS)),
        ui.field("Node", choice("site", HEAD_SITES)),
        ui.field("Shown", choice("column", COLUMNS)),
    ]
    return html.Div(
        [
            ui.page_head(
                "Patching",
                "Run the corrupted prompt with one node set to its value on the clean prompt: "
                "0 = the corrupted run, 1 = the clean run. Each visit of a looped layer is its "
                "own node. 'task' is the model's own pair: a Dyck prompt with a changed bracket "
                "or a recall row with a changed key; 'own' patches the two prompts below, which "
                "must have equal lengths in tokens.",
            ),
            ui.card(html.Div(controls, className="controls")),
            ui.card(
                _text_box("clean", s["clean"], "clean prompt (pair: own)"),
                _text_box("corrupt", s["corrupt"], "corrupted prompt, same length in tokens"),
                title="Your own pair",
                subtitle="Scored at the last position: the logit of the clean run's prediction "
                "minus the corrupted run's.",
            ),
            ui.message("patch-msg"),
            html.Div(id="patch-info", className="note"),
            ui.card(ui.graph("patch-heatmap"), title="Patched effect per (layer, visit) and head"),
            ui.card(
                ui.graph("patch-scatter"),
                title="Attribution against activation patching",
                subtitle="One backward pass estimates every node to first order; points off "
                "the line are where the estimate misses.",
            ),
        ]
    )


def figures(
    served: Served, model: str, pair: str, metric: str, site: str, column: str, clean, corrupt
):
    """(heatmap, scatter, info line, message, message style) for one choice of the controls."""
    model = served.registry.valid(model)
    own = pair == OWN
    request = PairRequest(
        kind=None if pair in ("task", OWN) else pair,
        clean=(clean or "") if own else None,
        corrupt=(corrupt or "") if own else None,
    )
    try:
        with served.registry.using(model) as loaded:
            chosen = request_pair(loaded, served.registry.info(model), request)
            n_nodes = len(nodes_of(loaded, site, per_head=True, length=chosen.length))
            full = patching_cost(loaded, chosen, n_nodes) <= PAGE_COST
            table = side_by_side(
                loaded, chosen, site, per_head=True, metric=metric, activation=full
            )
    except SmeltError as exc:
        blank = message_figure(str(exc))
        return (blank, blank, "", *ui.show_message(str(exc)))
    column = column if full else "attribution"
    title = f"{model} · {chosen.label} · {site} · {column}"
    heat = figs.effect_heatmap(table, column, title=title)
    if full:
        scatter = figs.attribution_scatter(table, title=f"{model} · {site}")
    else:
        scatter = message_figure(
            f"Activation patching of {n_nodes} {site} heads on {chosen.n_rows} rows is left to the "
            f"command on a model this size (python -m smelt_interp.probes.patching "
            f"{served.registry.paths[model]}); drawn here: attribution patching"
        )
    info = "; ".join(f"{name}: {value:.3f}" for name, value in headline(table, table.iloc[:0]))
    return (heat, scatter, info, *ui.show_message(None))


def register(app, served: Served) -> None:
    answers = FigureCache(served.registry)

    @app.callback(
        Output(ui.gid("patch-heatmap"), "figure"),
        Output(ui.gid("patch-scatter"), "figure"),
        Output("patch-info", "children"),
        Output("patch-msg", "children"),
        Output("patch-msg", "style"),
        *CONTROLS.inputs(),
    )
    def _draw(model, pair, metric, site, column, clean, corrupt):
        s = resolve(
            served, dict(zip(CONTROLS, (model, pair, metric, site, column, clean, corrupt)))
        )
        inputs = tuple(s[name] for name in CONTROLS)
        return answers.answer("patching", inputs, lambda: figures(served, *inputs))

    urls.write_to_url(app, QUERY, CONTROLS.url_sources())
