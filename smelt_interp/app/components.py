"""Layout pieces every page uses: the top bar, cards, labelled controls, graphs (with their
download settings) and the message box. Plain functions returning Dash components."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dash import dcc, html

GRAPH = "graph"
DEFAULT_FORMAT = "png"


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


def prompt_box(prefix: str, value: str, rows: int = 4, placeholder: str = "") -> html.Div:
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
                [html.Button("Run", id=f"{prefix}-run", n_clicks=0, className="button primary")],
                className="prompt-actions",
            ),
        ],
        className="prompt-row",
    )


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


CSS = """
:root { --ink:#1f2430; --muted:#6b7280; --line:#e5e7eb; --bg:#f5f6f8; --accent:#e4572e; --blue:#4c78a8; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
  font-family: Inter, 'Segoe UI', system-ui, -apple-system, Roboto, Helvetica, Arial, sans-serif; font-size:14px; }
.topbar { position:sticky; top:0; z-index:10; display:flex; align-items:center; gap:28px; padding:0 28px;
  height:54px; background:#1f2430; color:#fff; box-shadow:0 1px 3px rgba(0,0,0,.25); }
.brand { font-size:18px; font-weight:700; letter-spacing:.2px; }
.brand-a { color:#fff; } .brand-b { color:var(--accent); margin-left:2px; }
.nav-links { display:flex; gap:4px; flex:1; }
.nav-link { color:#cbd5e1; text-decoration:none; padding:8px 12px; border-radius:6px; font-weight:500; }
.nav-link:hover { background:#2d3343; color:#fff; }
.nav-link.active { background:#394055; color:#fff; box-shadow: inset 0 -2px 0 var(--accent); }
.nav-right { display:flex; align-items:center; gap:8px; }
.nav-note { color:#94a3b8; font-size:12px; }
main.page { max-width:1480px; margin:0 auto; padding:22px 28px 40px; }
.page-head h1 { font-size:22px; margin:0 0 4px; }
.page-head p { margin:0 0 18px; color:var(--muted); max-width:980px; line-height:1.45; }
.card { background:#fff; border:1px solid var(--line); border-radius:10px; padding:16px 18px; margin-bottom:18px;
  box-shadow:0 1px 2px rgba(16,24,40,.04); min-width:0; }
.card-title { font-size:15px; margin:0 0 2px; }
.card-subtitle { margin:0 0 10px; color:var(--muted); font-size:13px; }
.grid-2 { display:grid; grid-template-columns: minmax(0,1fr) minmax(0,1fr); gap:18px; }
.grid-focus { display:grid; grid-template-columns: minmax(0,3fr) minmax(0,2fr); gap:18px; }
@media (max-width: 1100px) { .grid-2, .grid-focus { grid-template-columns: minmax(0,1fr); } }
.controls { display:flex; flex-wrap:wrap; gap:14px 28px; align-items:flex-end; }
.field { display:flex; flex-direction:column; gap:6px; }
.field-label { font-size:12px; font-weight:600; color:var(--muted); text-transform:uppercase; letter-spacing:.4px; }
.pills { display:flex; flex-wrap:wrap; gap:6px; }
.pills .dash-options-list-option { position:relative; display:inline-flex; align-items:center; padding:5px 12px;
  border:1px solid #d1d5db; border-radius:999px; cursor:pointer; background:#fff; font-size:13px; user-select:none;
  margin:0; min-width:34px; justify-content:center; }
.pills .dash-options-list-option:hover { border-color:#9ca3af; }
.pills .dash-options-list-option.selected { background:var(--ink); color:#fff; border-color:var(--ink); }
.pills .dash-options-list-option-wrapper { position:absolute; opacity:0; width:0; height:0; overflow:hidden; }
.pills.dark .dash-options-list-option { background:transparent; color:#cbd5e1; border-color:#475569; padding:3px 10px;
  font-size:12px; }
.pills.dark .dash-options-list-option.selected { background:var(--accent); border-color:var(--accent); color:#fff; }
.check label { display:inline-flex; gap:6px; align-items:center; cursor:pointer; font-size:13px; }
.prompt-row { display:flex; gap:12px; align-items:stretch; }
.prompt { flex:1; width:100%; font-family: ui-monospace, 'SFMono-Regular', Menlo, Consolas, monospace; font-size:13px;
  border:1px solid #d1d5db; border-radius:8px; padding:8px 10px; resize:vertical; line-height:1.45; }
.prompt:focus { outline:2px solid #fbd3c6; border-color:var(--accent); }
.prompt-actions { display:flex; flex-direction:column; gap:8px; justify-content:flex-start; }
.button { border:1px solid #d1d5db; background:#fff; border-radius:8px; padding:8px 16px; font-weight:600;
  cursor:pointer; font-size:13px; }
.button.primary { background:var(--accent); border-color:var(--accent); color:#fff; }
.button:hover { filter:brightness(.96); }
.message { margin-top:10px; padding:10px 12px; border-radius:8px; background:#fef2f2; color:#991b1b;
  border:1px solid #fecaca; font-size:13px; }
.note { color:var(--muted); font-size:12.5px; margin:6px 0 0; }
.table { border-collapse:collapse; width:100%; font-size:13px; }
.table th { text-align:left; font-weight:600; color:var(--muted); border-bottom:1px solid var(--line); padding:6px 10px;
  font-size:12px; text-transform:uppercase; letter-spacing:.3px; }
.table td { border-bottom:1px solid #f1f2f4; padding:6px 10px; font-variant-numeric: tabular-nums; }
.table tr:last-child td { border-bottom:none; }
.models { display:grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr)); gap:18px; }
.model-card h3 { margin:0 0 2px; font-size:16px; display:flex; align-items:center; gap:8px; }
.swatch { display:inline-block; width:12px; height:12px; border-radius:3px; }
.kv { display:grid; grid-template-columns: auto 1fr; gap:3px 14px; font-size:13px; margin-top:8px; }
.kv dt { color:var(--muted); } .kv dd { margin:0; font-variant-numeric: tabular-nums; }
.path { font-family: ui-monospace, Menlo, monospace; font-size:12px; color:var(--muted); word-break:break-all; }
.badge { display:inline-block; padding:2px 9px; border-radius:999px; font-size:12px; font-weight:600; }
.badge.ok { background:#dcfce7; color:#166534; } .badge.bad { background:#fee2e2; color:#991b1b; }
.badge.warn { background:#fef3c7; color:#92400e; }
pre.dyck { background:#f8fafc; border:1px solid var(--line); border-radius:8px; padding:10px 12px; margin:0;
  font-size:13px; line-height:1.5; white-space:pre-wrap; word-break:break-all; }
pre.dyck mark { background:#fde8e1; color:#9a3412; padding:0 2px; border-radius:3px; }
code.mono, .mono { font-family: ui-monospace, Menlo, monospace; }
.paper-line { display:flex; gap:24px; flex-wrap:wrap; font-size:13px; margin:4px 0 6px; }
.paper-line b { font-variant-numeric: tabular-nums; }
a { color:var(--blue); }
.dash-input-container.num { width:120px; }
"""

INDEX = (
    """<!DOCTYPE html>
<html lang="en">
  <head>
    {%metas%}
    <title>{%title%}</title>
    {%favicon%}
    {%css%}
    <style>"""
    + CSS
    + """</style>
  </head>
  <body>
    {%app_entry%}
    <footer>{%config%}{%scripts%}{%renderer%}</footer>
  </body>
</html>"""
)
