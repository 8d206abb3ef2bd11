"""The look shared by the dashboard's figures: one font, white background, tight margins and a
fixed colour per model and a fixed dash/symbol per visit, so Baseline and SMELT, visit 0 and
visit 1 read the same on every page. Pure plotly (no Dash)."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

from smelt_interp.config import BASELINE, SMELT

FONT = "Inter, 'Segoe UI', system-ui, -apple-system, Roboto, Helvetica, Arial, sans-serif"
MODEL_COLORS = {BASELINE: "#4c78a8", SMELT: "#e4572e"}
_EXTRA_COLORS = ("#54a24b", "#b279a2", "#eeca3b", "#72b7b2", "#9d755d", "#ff9da6")
VISIT_DASH = ("solid", "dash", "dot", "dashdot")
VISIT_SYMBOL = ("circle", "diamond", "square", "triangle-up")
PAPER_COLOR = "#8c8c8c"
ATTENTION_SCALE = "Viridis"
ROUTING_SCALE = "Blues"
TEMPLATE = "plotly_white"  # plotly's registered template the figures start from


def model_color(name: str, index: int = 0) -> str:
    """The colour of a model: fixed for names containing baseline/smelt, else by position."""
    low = name.lower()
    for key, color in MODEL_COLORS.items():
        if key in low:
            return color
    return _EXTRA_COLORS[index % len(_EXTRA_COLORS)]


def visit_dash(visit: int) -> str:
    return VISIT_DASH[visit % len(VISIT_DASH)]


def visit_symbol(visit: int) -> str:
    return VISIT_SYMBOL[visit % len(VISIT_SYMBOL)]


def set_template(fig: go.Figure, name: str = TEMPLATE) -> None:
    """Give `fig` plotly's registered template `name` without validating it again.

    The registered templates are validated when plotly builds them; assigning one through the
    validating setter re-checks every trace type's defaults, about 80 ms a figure (most of what
    a dashboard figure costs), for the same result. Plotly sets its default template this way
    itself; where a future plotly lacks the switch, the validating assignment is used."""
    template = pio.templates[name]
    layout = fig.layout
    if not hasattr(layout, "_validate"):
        layout.template = template
        return
    validating = layout._validate
    layout._validate = False
    try:
        layout.template = template
    finally:
        layout._validate = validating


def style(
    fig: go.Figure,
    *,
    title: str | None = None,
    height: int | None = None,
    legend: bool = True,
    panels: bool = False,
) -> go.Figure:
    """Apply the common layout to `fig` (in place) and return it. The title sits top left and
    the legend in one row under it, clear of subplot titles (`panels`) and the modebar."""
    height = height or 420
    top = 28 + (30 if title else 0) + (26 if legend else 0) + (22 if panels else 0)
    set_template(fig)
    fig.update_layout(
        height=height,
        font=dict(family=FONT, size=13, color="#1f2430"),
        title=dict(
            text=title,
            x=0.0,
            xanchor="left",
            xref="paper",
            y=1 - 14 / height,
            yref="container",
            yanchor="top",
            font=dict(size=15),
        )
        if title
        else None,
        margin=dict(l=60, r=20, t=top, b=50),
        hoverlabel=dict(font=dict(family=FONT, size=12)),
        showlegend=legend,
        legend=dict(
            orientation="h",
            yref="container",
            y=1 - (14 + (30 if title else 0)) / height,
            yanchor="top",
            xref="paper",
            x=0.0,
            xanchor="left",
            bgcolor="rgba(0,0,0,0)",
            font=dict(size=12),
        ),
    )
    return fig


def message_figure(text: str, height: int = 260) -> go.Figure:
    """An empty figure that says `text` in its middle (for 'not applicable' or errors)."""
    fig = go.Figure()
    fig.add_annotation(
        text=text,
        x=0.5,
        y=0.5,
        xref="paper",
        yref="paper",
        showarrow=False,
        font=dict(size=14, color="#6b7280"),
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return style(fig, height=height, legend=False)
