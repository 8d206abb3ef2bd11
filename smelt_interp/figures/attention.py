"""Attention-pattern figures: one head as a heatmap with token labels, every head of a (layer,
visit) as a grid, and the same head in each visit side by side. Inputs are plain arrays
(`pattern[query, key]`, causal, rows summing to 1) and per-token labels; pure plotly.

Axes are categorical, one category per position ("12 (" = position 12, token "("), so hover
text names both tokens without a per-cell text matrix; tick text shows the token alone."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from smelt_interp.figures.theme import ATTENTION_SCALE, style

MAX_TICKS = 64
HOVER = "query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>"


def token_categories(labels: Sequence[str]) -> list[str]:
    """One unique axis category per position: 'index token'."""
    return [f"{i} {label}" for i, label in enumerate(labels)]


def _ticks(labels: Sequence[str], max_ticks: int = MAX_TICKS) -> dict:
    cats = token_categories(labels)
    step = max(1, math.ceil(len(cats) / max_ticks))
    idx = list(range(0, len(cats), step))
    return dict(
        tickmode="array",
        tickvals=[cats[i] for i in idx],
        ticktext=[labels[i] for i in idx],
        tickangle=0,
        tickfont=dict(size=10 if len(idx) > 40 else 11, family="monospace"),
    )


def _masked(pattern: np.ndarray) -> np.ndarray:
    """float32 copy with the causally invisible (future) cells as NaN, so they draw blank."""
    z = np.asarray(pattern, dtype=np.float32).copy()
    t = z.shape[-1]
    z[..., np.triu_indices(t, k=1)[0], np.triu_indices(t, k=1)[1]] = np.nan
    return z


def colour_max(pattern: np.ndarray, skip_bos: bool) -> float:
    """Top of the colour scale: the largest weight, or with `skip_bos` the largest weight on a
    key other than BOS (position 0) from a query other than BOS."""
    z = np.asarray(pattern, dtype=np.float64)
    part = z[..., 1:, 1:] if skip_bos and z.shape[-1] > 1 else z
    top = float(np.nanmax(part)) if part.size else 1.0
    return top if top > 0 else 1.0


def head_heatmap(
    pattern: np.ndarray,
    labels: Sequence[str],
    *,
    title: str | None = None,
    skip_bos: bool = False,
    height: int = 620,
) -> go.Figure:
    """One head's pattern [T, T]: query positions down, key positions across."""
    cats = token_categories(labels)
    fig = go.Figure(
        go.Heatmap(
            z=_masked(pattern),
            x=cats,
            y=cats,
            colorscale=ATTENTION_SCALE,
            zmin=0.0,
            zmax=colour_max(pattern, skip_bos),
            hovertemplate=HOVER,
            colorbar=dict(title=dict(text="weight", side="right"), thickness=12),
        )
    )
    fig.update_xaxes(title_text="key", type="category", **_ticks(labels), showgrid=False)
    fig.update_yaxes(
        title_text="query", type="category", autorange="reversed", **_ticks(labels), showgrid=False
    )
    style(fig, title=title, height=height, legend=False)
    fig.update_layout(plot_bgcolor="#f3f4f6")
    return fig


def _panel(
    fig: go.Figure, pattern: np.ndarray, cats: list[str], name: str, *, row: int, col: int
) -> None:
    """One pattern as a heatmap in subplot (row, col), on the figure's shared colour axis."""
    fig.add_trace(
        go.Heatmap(
            z=_masked(pattern),
            x=cats,
            y=cats,
            coloraxis="coloraxis",
            hovertemplate=f"{name}<br>" + HOVER,
            name=name,
        ),
        row=row,
        col=col,
    )


def _shared_scale(fig: go.Figure, zmax: float) -> None:
    """The one colour scale, 0..zmax, of every panel."""
    fig.update_layout(
        coloraxis=dict(
            colorscale=ATTENTION_SCALE,
            cmin=0.0,
            cmax=zmax,
            colorbar=dict(title=dict(text="weight"), thickness=12),
        )
    )


def head_grid(
    patterns: np.ndarray,
    labels: Sequence[str],
    *,
    title: str | None = None,
    skip_bos: bool = False,
    focus: int | None = None,
    cols: int = 4,
    height_per_row: int | None = None,
    height: int = 620,
) -> go.Figure:
    """Every head of one (layer, visit), patterns [H, T, T], on one shared colour scale, in
    about `height` pixels (or `height_per_row` per row); the `focus` head's title is marked.
    Click a head to focus it (curveNumber = head)."""
    n_heads = patterns.shape[0]
    cols = max(1, min(cols, n_heads))
    rows = math.ceil(n_heads / cols)
    height_per_row = height_per_row or max(150, (height - 90) // rows)
    titles = [f"<b>head {h} ◀</b>" if h == focus else f"head {h}" for h in range(n_heads)]
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=titles,
        horizontal_spacing=0.03,
        vertical_spacing=0.12 / rows,
    )
    cats = token_categories(labels)
    zmax = colour_max(patterns, skip_bos)
    for h in range(n_heads):
        _panel(fig, patterns[h], cats, f"head {h}", row=h // cols + 1, col=h % cols + 1)
    fig.update_xaxes(type="category", showticklabels=False, showgrid=False)
    fig.update_yaxes(type="category", autorange="reversed", showticklabels=False, showgrid=False)
    _shared_scale(fig, zmax)
    style(fig, title=title, height=height_per_row * rows + 90, legend=False, panels=True)
    fig.update_layout(plot_bgcolor="#f3f4f6", margin=dict(l=20, r=20))
    return fig


def visit_pair(
    patterns: Mapping[int, np.ndarray],
    labels: Sequence[str],
    *,
    title: str | None = None,
    skip_bos: bool = False,
    height: int = 470,
) -> go.Figure:
    """One head in each visit of a looped layer ({visit: [T, T]}), side by side on one scale."""
    visits = sorted(patterns)
    fig = make_subplots(
        rows=1,
        cols=len(visits),
        subplot_titles=[f"visit {v}" for v in visits],
        horizontal_spacing=0.06,
    )
    cats = token_categories(labels)
    zmax = max(colour_max(patterns[v], skip_bos) for v in visits)
    for i, v in enumerate(visits):
        _panel(fig, patterns[v], cats, f"visit {v}", row=1, col=i + 1)
    ticks = _ticks(labels, max_ticks=MAX_TICKS // 2)
    fig.update_xaxes(type="category", showgrid=False, **ticks)
    fig.update_yaxes(type="category", autorange="reversed", showgrid=False, **ticks)
    _shared_scale(fig, zmax)
    style(fig, title=title, height=height, legend=False, panels=True)
    fig.update_layout(plot_bgcolor="#f3f4f6")
    return fig
