"""Registered probes on the dashboard: every probe whose spec names a page gets a card there
with its figures, computed once per model on the Workbench's probe inputs and cached. A page
lists in DRAWS the probes it already shows with its own controls; every other registered probe
for that page (one written by a user, say) appears here with no edit to the app."""

from __future__ import annotations

from types import ModuleType

from dash import MATCH, Dash, Input, Output, dcc, html

from smelt_interp.app import components as ui
from smelt_interp.app.compute import Workbench
from smelt_interp.errors import SmeltError
from smelt_interp.figures.probes import probe_figures
from smelt_interp.probes.registry import ProbeSpec, get, registered

SECTION = "probe-section"


def specs_for(page: ModuleType) -> list[ProbeSpec]:
    """The registered probes that name `page` and that it does not draw itself."""
    own = set(getattr(page, "DRAWS", ()))
    return [spec for spec in registered() if spec.page == page.PATH and spec.name not in own]


def cards(page: ModuleType) -> list[html.Section]:
    """One card per probe of specs_for(page), filled by the callback below when it appears."""
    return [
        ui.card(
            dcc.Loading(html.Div(id={"type": SECTION, "probe": spec.name}), type="dot"),
            title=spec.description or spec.name,
            subtitle=f"Probe '{spec.name}'.",
        )
        for spec in specs_for(page)
    ]


def register(app: Dash, wb: Workbench) -> None:
    @app.callback(
        Output({"type": SECTION, "probe": MATCH}, "children"),
        Input({"type": SECTION, "probe": MATCH}, "id"),
    )
    def _fill(section_id: dict) -> list:
        try:
            spec = get(str(section_id["probe"]))
            figures = probe_figures(spec, wb.probe_tables(spec))
        except (SmeltError, KeyError, TypeError) as exc:
            return [html.Div(str(exc), className="message")]
        if not figures:
            return [
                html.Div("This probe applies to none of the served models.", className="message")
            ]
        return [
            dcc.Graph(figure=fig, config=ui.graph_config(f"{spec.name}-{i}"), className="graph")
            for i, fig in enumerate(figures)
        ]
