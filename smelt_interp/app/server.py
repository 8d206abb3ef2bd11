"""The Dash app: a top bar, a hand-rolled router on dcc.Location (pathname picks the page, the
query string carries its state), and each page's callbacks."""

from __future__ import annotations

from dash import ALL, Dash, Input, Output, State, dcc, html

from smelt_interp.app import components as ui
from smelt_interp.app.compute import Workbench
from smelt_interp.app.pages import PAGES
from smelt_interp.app.state import decode_state

NAV = tuple((page.PATH, page.TITLE) for page in PAGES)
_BY_PATH = {page.PATH: page for page in PAGES}

# The camera button of every graph on the page downloads the format chosen in the top bar.
_FORMAT_JS = """
function(fmt, _page) {
    fmt = fmt || 'png';
    // dcc.Graph re-plots only when its figure changes, so also patch the graphs drawn already
    // (Plotly reads toImageButtonOptions when the camera button is clicked).
    document.querySelectorAll('.js-plotly-plot').forEach(gd => {
        if (gd._context) {
            gd._context.toImageButtonOptions = Object.assign({}, gd._context.toImageButtonOptions, {format: fmt});
        }
    });
    const outs = (dash_clientside.callback_context.outputs_list || []);
    return outs.map(o => ({displaylogo: false, modeBarButtonsToRemove: ['lasso2d', 'select2d'],
        toImageButtonOptions: {format: fmt, filename: 'smelt-' + o.id.name, scale: 2}}));
}
"""


def not_found(path: str) -> html.Div:
    return html.Div(
        [
            ui.page_head("Page not found", f"There is no page at {path}."),
            ui.card(html.Ul([html.Li(dcc.Link(title, href=p)) for p, title in NAV])),
        ]
    )


def create_app(wb: Workbench, *, title: str = "smelt-interp") -> Dash:
    app = Dash(
        __name__,
        title=title,
        suppress_callback_exceptions=True,
        serve_locally=True,
        update_title=None,
    )
    app.index_string = ui.INDEX
    app.layout = html.Div(
        [
            dcc.Location(id="url", refresh="callback-nav"),
            ui.navbar(NAV),
            html.Main(id="page", className="page"),
        ]
    )

    @app.callback(
        Output("page", "children"),
        Output({"type": "nav", "path": ALL}, "className"),
        Input("url", "pathname"),
        State("url", "search"),
    )
    def _route(pathname, search):
        page = _BY_PATH.get(pathname or "/")
        content = page.layout(wb, decode_state(search)) if page else not_found(pathname)
        classes = ["nav-link active" if page and p == page.PATH else "nav-link" for p, _ in NAV]
        return content, classes

    @app.callback(Output({"type": "nav", "path": ALL}, "href"), Input("url", "search"))
    def _nav_links(search):
        return [p + (search or "") for p, _ in NAV]

    app.clientside_callback(
        _FORMAT_JS,
        Output({"type": ui.GRAPH, "name": ALL}, "config"),
        Input("img-format", "value"),
        Input("page", "children"),
    )

    for page in PAGES:
        page.register(app, wb)
    return app
