"""Figures of the Dyck in-context case study (probes.case_study): attention mass from the answer
positions onto BOS and onto the demonstrations' answers, by effective depth and per visit,
and the loop-span averages beside the paper's first- and second-visit values
(smelt_interp.paper.DYCK). Pure plotly."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from smelt_interp import paper
from smelt_interp.figures.loop import by_visit_lines, shade_passes
from smelt_interp.figures.theme import PAPER_COLOR, message_figure, model_color, style
from smelt_interp.probes.common import loop_span

_MASS = (("bos_mass", "mass on BOS"), ("demo_mass", "mass on demonstration answers"))


def _mass_panels(spacing: float) -> go.Figure:
    """Two panels sharing the y axis: mass on BOS, mass on the demonstrations' answers."""
    return make_subplots(
        rows=1,
        cols=2,
        subplot_titles=[t for _, t in _MASS],
        shared_yaxes=True,
        horizontal_spacing=spacing,
    )


def mass_by_depth(frames: Mapping[str, pd.DataFrame], *, title: str | None = None) -> go.Figure:
    """BOS and demonstration-answer mass (head means) by effective depth, one line per (model,
    visit); frames are measure.case_heads.by_visit tables."""
    if not frames:
        return message_figure("no models")
    fig = _mass_panels(spacing=0.04)
    for col, (stat, label) in enumerate(_MASS, start=1):
        shade_passes(fig, frames, row=1, col=col)
        by_visit_lines(fig, frames, stat, label, legend=col == 1, row=1, col=col)
        fig.update_xaxes(title_text="effective depth", dtick=1, row=1, col=col)
    fig.update_yaxes(title_text="attention mass from the answer", range=[0, 1.02], row=1, col=1)
    return style(fig, title=title, height=400, panels=True)


def loop_span_means(frame: pd.DataFrame) -> dict[str, list[float]]:
    """{'bos_mass': [visit 0, visit 1, ...], 'demo_mass': [...]}: head and layer means over the
    loop span (for a Baseline, the layers the paper's recipe would loop)."""
    span = frame[frame["layer"].isin(loop_span(frame))]
    out = {}
    for stat, _ in _MASS:
        per_visit = span.groupby("visit")[stat].mean().sort_index()
        out[stat] = [float(v) for v in per_visit]
    return out


def paper_comparison(frames: Mapping[str, pd.DataFrame], *, title: str | None = None) -> go.Figure:
    """Loop-span means per visit for each model beside the paper's values (first and second
    visit): two panels, BOS mass and demonstration mass."""
    if not frames:
        return message_figure("no models")
    fig = _mass_panels(spacing=0.05)
    for col, (stat, _) in enumerate(_MASS, start=1):
        ref = paper.DYCK[stat]
        fig.add_trace(
            go.Bar(
                x=["visit 0", "visit 1"],
                y=[ref.lo, ref.hi],
                name="paper (SMELT)",
                marker=dict(color=PAPER_COLOR, pattern=dict(shape="/")),
                legendgroup="paper",
                showlegend=col == 1,
                text=[f"{v:.2f}" for v in (ref.lo, ref.hi)],
                textposition="outside",
                hovertemplate="paper %{x}: %{y:.2f}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        for i, (name, frame) in enumerate(frames.items()):
            ours = loop_span_means(frame)[stat]
            x = [f"visit {v}" for v in range(len(ours))]
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=ours,
                    name=f"ours: {name}",
                    marker_color=model_color(name, i),
                    legendgroup=name,
                    showlegend=col == 1,
                    text=[f"{v:.2f}" for v in ours],
                    textposition="outside",
                    hovertemplate=f"{name} %{{x}}: %{{y:.3f}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    fig.update_yaxes(range=[0, 1.1], title_text="mean over the loop span", row=1, col=1)
    fig.update_layout(barmode="group", bargap=0.25)
    return style(fig, title=title, height=400, panels=True)
