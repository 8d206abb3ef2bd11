"""Layout pieces every page uses: the top bar, cards, labelled controls, graphs (with their
download settings) and the message box. Plain functions returning Dash components; their look
is in assets/smelt.css (by class name)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dash import Input, Output, State, dcc, html

GRAPH = "graph"
DEFAULT_FORMAT = "png"
NO_FIGURE = "no figure: the prompt could not be used"  # a graph's text beside a prompt error


def graph_config(name: str, fmt: str = DEFAULT_FORMAT) -> dict[str, Any]:
    """Plotly modebar settings: the camera button downloads `fmt` (png or svg) client-side."""
    return {
        "displaylogo": False,
        "modeBarButtonsToRemove": ["lasso2d", "select2d"],
        "toImageButtonOptions": {"format": fmt, "filename": f"smelt-{name}", "scale": 2},
    }


def graph(name: str, height: int | None = None, loading: bool = True) -> Any:
    """A dcc.Graph with id {'type': 'graph', 'name': name}, optionally under a spinner that
    shows only for work that takes a while."""
    g = dcc.Graph(
        id={"type": GRAPH, "name": name},
        config=graph_config(name),
        style={"height": f"{height}px"} if height else {},
        className="graph",
    )
    return dcc.Loading(g, delay_show=400, type="dot", color="#e4572e") if loading else g


def gid(name: str) -> dict[str, str]:
    """The id of graph `name` (for callbacks)."""
    return {"type": GRAPH, "name": name}


def page_head(title: str, text: str) -> html.Div:
    """A page's title and its one-paragraph explanation."""
    return html.Div([html.H1(title), html.P(text)], className="page-head")


def card(
    *children: Any,
    title: str | None = None,
    subtitle: str | None = None,
    class_name: str = "",
    **kwargs: Any,
) -> html.Section:
    head = []
    if title:
        head.append(html.H2(title, className="card-title"))
    if subtitle:
        head.append(html.P(subtitle, className="card-subtitle"))
    return html.Section([*head, *children], className=f"card {class_name}".strip(), **kwargs)


def field(label: str, control: Any, class_name: str = "") -> html.Div:
    return html.Div(
        [html.Label(label, className="field-label"), control],
        className=f"field {class_name}".strip(),
    )


def radio(
    id: str, options: Sequence[Any], value: Any, labels: Sequence[str] | None = None
) -> dcc.RadioItems:
    labels = labels or [str(o) for o in options]
    return dcc.RadioItems(
        id=id,
        options=[{"label": lab, "value": o} for o, lab in zip(options, labels)],
        value=value,
        inline=True,
        className="pills",
    )


def message(id: str) -> html.Div:
    """The box a page writes a prompt error into (hidden while empty)."""
    return html.Div(id=id, className="message", role="alert", style={"display": "none"})


def show_message(text: str | None) -> tuple[str, dict]:
    """(children, style) of a message box: shown with `text`, or hidden."""
    return (text or "", {"display": "block"} if text else {"display": "none"})


def prompt_box(
    prefix: str, value: str, rows: int = 4, placeholder: str = "", context: str = ""
) -> html.Div:
    """A text box ('<prefix>-prompt'), its Run button ('<prefix>-run') with the model's context
    beside it ('<prefix>-context': how many tokens a prompt may have) and the store holding
    the text last run ('<prefix>-applied', see run_prompt_on_click): figures follow the store,
    not every keystroke."""
    return html.Div(
        [
            dcc.Textarea(
                id=f"{prefix}-prompt",
                value=value,
                rows=rows,
                spellCheck=False,
                className="prompt",
                placeholder=placeholder,
            ),
            html.Div(
                [
                    html.Button("Run", id=f"{prefix}-run", n_clicks=0, className="button primary"),
                    html.Span(context, id=f"{prefix}-context", className="prompt-context"),
                ],
                className="prompt-actions",
            ),
            dcc.Store(id=f"{prefix}-applied", data=value),
        ],
        className="prompt-row",
    )


def run_prompt_on_click(app: Any, prefix: str) -> None:
    """Register the callback of a prompt_box: Run copies the text into its store."""

    @app.callback(
        Output(f"{prefix}-applied", "data"),
        Input(f"{prefix}-run", "n_clicks"),
        State(f"{prefix}-prompt", "value"),
        prevent_initial_call=True,
    )
    def _run(_, text):
        return text or ""


def context_follows_model(app: Any, prefix: str, model: Input, note: Callable[[Any], str]) -> None:
    """Register the callback that keeps a prompt_box's context note on the chosen model."""

    @app.callback(Output(f"{prefix}-context", "children"), model)
    def _context(name):
        return note(name)


def navbar(pages: Sequence[tuple[str, str]]) -> html.Header:
    links = [
        dcc.Link(title, href=path, id={"type": "nav", "path": path}, className="nav-link")
        for path, title in pages
    ]
    fmt = html.Div(
        [
            html.Span("Figure download", className="nav-note"),
            dcc.RadioItems(
                id="img-format",
                options=[{"label": "PNG", "value": "png"}, {"label": "SVG", "value": "svg"}],
                value=DEFAULT_FORMAT,
                inline=True,
                persistence=True,
                className="pills dark",
            ),
        ],
        className="nav-right",
        title="Format of the modebar's camera button on every figure",
    )
    return html.Header(
        [
            html.Div(
                [html.Span("smelt", className="brand-a"), html.Span("interp", className="brand-b")],
                className="brand",
            ),
            html.Nav(links, className="nav-links"),
            fmt,
        ],
        className="topbar",
    )


def table(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], class_name: str = ""
) -> html.Table:
    return html.Table(
        [
            html.Thead(html.Tr([html.Th(c) for c in columns])),
            html.Tbody([html.Tr([html.Td(v) for v in row]) for row in rows]),
        ],
        className=f"table {class_name}".strip(),
    )


def subject(names: Sequence[str], one: str, many: str) -> str:
    """The served models `names` as a sentence's subject: 'a has' or 'a, b have' (one, many)."""
    return f"{names[0]} {one}" if len(names) == 1 else f"{', '.join(names)} {many}"
