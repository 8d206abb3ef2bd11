"""The Dash app: a top bar over Dash's pages mechanism, with the styles and client-side code in
assets/ (next to this file; Dash serves that folder).

Pages are registered explicitly (`use_pages=True`, `pages_folder=""`) from
smelt_interp.app.pages. A page needs the Served (the loaded models and their caches), which
exists only at run time, while Dash calls a page's layout with only the URL's query
parameters. So create_app registers each page with a closure over its Served that decodes
the query by the page's own QUERY and calls `page.layout(served, state)`; the page modules stay
plain functions of (served, state) that tests call directly. Dash keeps registered pages in one
process-wide registry (dash.page_registry), so a process serves one app: the last create_app
wins.

Two dcc.Location components watch the address bar. Dash's own, in dash.page_container, picks
the page when the user navigates (a link, Back, a typed URL). Ours ("url", refresh=False) is
where pages write their state as controls change, and what the nav bar reads: it updates the
address without telling Dash's router, which re-renders the page whenever its own Location's
query string changes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import dash
from dash import ALL, ClientsideFunction, Dash, Input, Output, State, dcc, html

from smelt_interp.app import components as ui
from smelt_interp.app import pending, urls, value_kinds
from smelt_interp.app.guarded import guard
from smelt_interp.app.http_hardening import HardenedDash
from smelt_interp.app.pages import PAGES, probe_section
from smelt_interp.app.served import Served

ASSETS = Path(__file__).resolve().with_name("assets")
NAV = tuple((page.PATH, page.TITLE) for page in PAGES)
PAGES_LOCATION = "_pages_location"  # ids in dash.page_container: its dcc.Location,
PAGES_CONTENT = "_pages_content"  # and the Div the current page is drawn into
NOT_FOUND = "not_found_404"  # the module name Dash pages serves for an unknown path


def not_found(pathname: str | None = None, **_: Any) -> html.Div:
    return html.Div(
        [
            ui.page_head("Page not found", f"There is no page at {pathname}."),
            ui.card(html.Ul([html.Li(dcc.Link(title, href=p)) for p, title in NAV])),
        ]
    )


def page_layout(page: ModuleType, served: Served) -> Callable[..., html.Div]:
    """Dash pages' layout function for `page`: its query parameters decoded by page.QUERY."""

    def layout(**params: Any) -> html.Div:
        own = pending.layout(page, served, urls.decode_params(page.QUERY, params))
        return html.Div([own, *probe_section.cards(page)]) if probe_section.specs_for(page) else own

    return layout


class Dashboard(HardenedDash):
    """The dashboard's Dash: HTTP requests hardened (smelt_interp.app.http_hardening), and every
    server callback registered on it run behind `guard` with the app's `kinds` (the declared
    kind of each control's value, smelt_interp.app.guarded)."""

    def __init__(self, *args: Any, kinds: Mapping[str, value_kinds.Kind] | None = None, **kw: Any):
        self.kinds: dict[str, value_kinds.Kind] = dict(kinds or {})
        super().__init__(*args, **kw)

    def callback(self, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        register = super().callback(*args, **kwargs)
        return lambda func: register(guard(func, self.kinds))


def input_kinds() -> dict[str, value_kinds.Kind]:
    """The kind of every page control's value (each page's INPUTS), checked by the guard."""
    kinds = {"img-format.value": value_kinds.NAME, **pending.INPUTS}
    for page in PAGES:
        kinds.update(getattr(page, "INPUTS", {}))
    return kinds


def create_app(served: Served, *, title: str = "smelt-interp") -> Dash:
    """The dashboard over `served`; every server callback runs behind smelt_interp.app.guarded."""
    app = Dashboard(
        __name__,
        kinds=input_kinds(),
        title=title,
        assets_folder=str(ASSETS),
        use_pages=True,
        pages_folder="",
        routing_callback_inputs={"pathname": State(PAGES_LOCATION, "pathname")},  # for the 404
        include_pages_meta=False,  # no social-media preview tags on a localhost tool
        suppress_callback_exceptions=True,
        serve_locally=True,
        update_title=None,
    )
    for order, page in enumerate(PAGES):
        dash.register_page(
            page.__name__,
            path=page.PATH,
            name=page.TITLE,
            order=order,
            layout=page_layout(page, served),
            redirect_from=list(getattr(page, "REDIRECT_FROM", ())),
        )
    dash.register_page(NOT_FOUND, path="/404", name="Page not found", layout=not_found)
    app.layout = html.Div(
        [
            dcc.Location(id=urls.URL, refresh=False),
            ui.navbar(NAV),
            html.Main(dash.page_container, id="page", className="page"),
        ]
    )

    @app.callback(
        Output({"type": "nav", "path": ALL}, "className"),
        Output({"type": "nav", "path": ALL}, "href"),
        Input(urls.URL, "pathname"),
        Input(urls.URL, "search"),
    )
    def _nav(pathname, search):
        """The current page's link highlighted; every link keeps the query string."""
        classes = ["nav-link active" if p == pathname else "nav-link" for p, _ in NAV]
        return classes, [p + (search or "") for p, _ in NAV]

    app.clientside_callback(
        ClientsideFunction("smelt", "graphConfig"),  # assets/graph_config.js
        Output({"type": ui.GRAPH, "name": ALL}, "config"),
        Input("img-format", "value"),
        Input(PAGES_CONTENT, "children"),  # new graphs get the chosen format too
    )

    for page in PAGES:
        page.register(app, served)
    probe_section.register(app, served)
    pending.register(app, served)
    return app
