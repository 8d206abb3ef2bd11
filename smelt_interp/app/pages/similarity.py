"""Similarity and residual: how alike the two visits of a looped layer compute (Q/K/V cosine,
top-8 attended-key overlap) against consecutive distinct layers, and how much each visit
writes into the residual stream."""

from __future__ import annotations

from dash import Input, Output, html

from smelt_interp import paper
from smelt_interp.app import components as ui
from smelt_interp.app import guard, urls
from smelt_interp.app.compute import Workbench
from smelt_interp.figures import loop as figs

PATH = "/similarity"
TITLE = "Similarity & residual"
DRAWS = (
    "similarity",
    "residual",
)  # registered probes this page draws itself (see app/probe_section.py)
# this page's URL keys and their types, in URL order
QUERY: urls.Query = {"model": str, "value": str}
VALUES = ("relative", "write_norm")
# the kind of value each control carries (checked before any callback runs)
INPUTS = {"sim-model.value": guard.NAME, "sim-value.value": guard.choice(*VALUES)}


def layout(wb: Workbench, state: dict) -> html.Div:
    model = wb.registry.valid(state.get("model"))
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
                    [ui.field("Model", ui.radio("sim-model", wb.registry.names, model))],
                    className="controls",
                ),
                ui.graph("sim-qkv"),
                title="Q/K/V cosine and top-8 overlap",
                subtitle=f"Head means on {wb.batch_description}. A Baseline has only the control. "
                f"Shaded bands: the paper's ranges (Q/K {paper.COS_Q}, V {paper.COS_V}, "
                f"top-8 {paper.TOP8_OVERLAP}, control {paper.TOP8_OVERLAP_CONTROL}).",
            ),
            ui.card(
                html.Div(
                    [
                        ui.field(
                            "Show",
                            ui.radio(
                                "sim-value",
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


def register(app, wb: Workbench) -> None:
    @app.callback(Output(ui.gid("sim-qkv"), "figure"), Input("sim-model", "value"))
    def _qkv(model):
        model = wb.registry.valid(model)
        return figs.qkv_similarity(wb.similarity(model), model=model, title=model)

    @app.callback(Output(ui.gid("sim-residual"), "figure"), Input("sim-value", "value"))
    def _residual(value):
        return figs.residual_writes({n: wb.residual(n) for n in wb.registry.names}, value=value)

    urls.write_to_url(
        app, QUERY, {"model": Input("sim-model", "value"), "value": Input("sim-value", "value")}
    )
