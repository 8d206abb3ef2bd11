"""One self-contained HTML page of figures (plotly.js inlined once, with the first figure): what
the report, the scaling fit and the downstream analysis write with `--html`/`--plot`."""

from __future__ import annotations

import html
from collections.abc import Iterable

import plotly.graph_objects as go

STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
    "td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}"
)


def html_page(title: str, sections: Iterable[str | go.Figure]) -> str:
    """A whole page titled `title`: each section is a figure or a ready HTML fragment, in order."""
    parts = [
        "<!doctype html>",
        "<html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
    ]
    first = True
    for section in sections:
        if isinstance(section, go.Figure):
            parts.append(section.to_html(full_html=False, include_plotlyjs=first))
            first = False
        else:
            parts.append(section)
    parts.append("</body></html>\n")
    return "\n".join(parts)
