"""Registered probes that no page draws, on the dashboard: each gets a card on
pages.OTHER_PROBES_PAGE with its spec's figures (smelt_interp.figures.probes, as the report
draws them), from the Served's cached spec.run tables. So a probe written by a user appears
with no edit to the app."""

from __future__ import annotations

from types import ModuleType

from dash import MATCH, Dash, Input, Output, dcc, html

from smelt_interp.app import components as ui
from smelt_interp.app.pages import OTHER_PROBES_PAGE, PAGES, REPORT_ONLY
from smelt_interp.app.probe_tables import probe_tables
from smelt_interp.app.served import Served
from smelt_interp.errors import SmeltError
from smelt_interp.figures.probes import probe_figures
from smelt_interp.probes.registry import ProbeSpec, get, registered

SECTION = "probe-section"


def unshown() -> list[ProbeSpec]:
    """The registered probes that no page names in its PROBES and that are not report-only."""
    shown = {name for page in PAGES for name in page.PROBES} | set(REPORT_ONLY)
    return [spec for spec in registered() if spec.name not in shown]


def specs_for(page: ModuleType) -> list[ProbeSpec]:
    """The probes `page` shows as cards: the unshown ones, on OTHER_PROBES_PAGE only."""
    return unshown() if page is OTHER_PROBES_PAGE else []


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


def register(app: Dash, served: Served) -> None:
    @app.callback(
        Output({"type": SECTION, "probe": MATCH}, "children"),
        Input({"type": SECTION, "probe": MATCH}, "id"),
    )
    def _fill(section_id: dict) -> list:
        try:
            spec = get(str(section_id["probe"]))
            figures = probe_figures(spec, probe_tables(served, spec))
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
