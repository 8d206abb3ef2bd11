"""Similarity and residual: how alike the two visits of a looped layer compute (Q/K/V cosine,
top-8 attended-key overlap) against consecutive distinct layers, and how much each visit
writes into the residual stream."""

from __future__ import annotations

from dash import Output, html

from smelt_interp import paper
from smelt_interp.app import components as ui
from smelt_interp.app import urls
from smelt_interp.app import value_kinds as kind
from smelt_interp.app.controls import Control, Controls
from smelt_interp.app.figure_cache import FigureCache
from smelt_interp.app.probe_tables import batch_description, model_tables, probe_tables
from smelt_interp.app.served import Served
from smelt_interp.figures import loop as figs
from smelt_interp.probes.registry import get

PATH = "/similarity"
TITLE = "Similarity & residual"
PROBES = ("similarity", "residual")  # the registered probes whose tables this page draws
VALUES = ("relative", "write_norm")
# the page's controls (the URL keys in URL order), declared once; QUERY and INPUTS follow
CONTROLS = Controls(
    model=Control("sim-model", "value", kind.NAME, url=str),
    value=Control("sim-value", "value", kind.choice(*VALUES), url=str),
)
QUERY: urls.Query = CONTROLS.query
INPUTS = CONTROLS.kinds


def layout(served: Served, state: dict) -> html.Div:
    model = served.registry.valid(state.get("model"))
    value = state.get("value") if state.get("value") in VALUES else "relative"
    return html.Div(
        [
            ui.page_head(
                "Similarity and residual writes",
                "Per looped layer, visit 0 against visit 1: cosine of the queries, keys and "
                "values per token and head, and the share of the 8 most attended keys both visits "
                "pick. The control compares layer l with layer l + 1 (both first visits).",
            ),
            ui.card(
                html.Div(
                    [
                        ui.field(
                            "Model", ui.radio(CONTROLS.id("model"), served.registry.names, model)
                        )
                    ],
                    className="controls",
                ),
                ui.graph("sim-qkv"),
                title="Q/K/V cosine and top-8 overlap",
                subtitle=f"Head means on {batch_description(served)}. A Baseline has only the "
                f"control. Shaded bands: the paper's ranges (Q/K {paper.COS_Q}, V {paper.COS_V}, "
                f"top-8 {paper.TOP8_OVERLAP}, control {paper.TOP8_OVERLAP_CONTROL}).",
            ),
            ui.card(
                html.Div(
                    [
                        ui.field(
                            "Show",
                            ui.radio(
                                CONTROLS.id("value"),
                                list(VALUES),
                                value,
                                ["relative to the residual", "absolute norm"],
                            ),
                        )
                    ],
                    className="controls",
                ),
                ui.graph("sim-residual"),
                title="Residual write norms per visit",
                subtitle="Norm of what attention and the MoE add to the residual stream (after "
                "SMELT's 1/r scaling), by effective depth; one line per visit.",
            ),
        ]
    )


def register(app, served: Served) -> None:
    figures = FigureCache(served.registry)  # the page's answers, shared between users

    @app.callback(Output(ui.gid("sim-qkv"), "figure"), *CONTROLS.inputs("model"))
    def _qkv(model):
        return figures.answer("qkv", (model,), lambda: qkv_figure(served, model))

    @app.callback(Output(ui.gid("sim-residual"), "figure"), *CONTROLS.inputs("value"))
    def _residual(value):
        return figures.answer("residual", (value,), lambda: residual_figure(served, value))

    urls.write_to_url(app, QUERY, CONTROLS.url_sources())


def qkv_figure(served: Served, model: str | None):
    """The similarity probe's per-head Q/K/V similarity of `model` (the default when unknown)."""
    model = served.registry.valid(model)
    return figs.qkv_similarity(
        model_tables(served, "similarity", model)["heads"], model=model, title=model
    )


def residual_figure(served: Served, value: str):
    """The residual probe's write norms of every served model, as `value` says."""
    writes = {n: t["writes"] for n, t in probe_tables(served, get("residual")).items()}
    return figs.residual_writes(writes, value=value)
