"""Figures of the downstream comparison: gain by domain, by sample length, and the Dyck
accuracy of both models by number of in-context examples."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go

from smelt_interp.config import ARCHS, SMELT
from smelt_interp.figures.page import html_page
from smelt_interp.figures.theme import model_color

if TYPE_CHECKING:
    from smelt_interp.analysis.downstream import DownstreamReport


def gain_bars(table: pd.DataFrame, key: str, title: str) -> go.Figure:
    """Relative CE gain with its bootstrap interval, one bar per `key` value."""
    fig = go.Figure(
        go.Bar(
            x=table[key].astype(str),
            y=table["gain"] * 100,
            error_y=dict(
                type="data",
                symmetric=False,
                array=(table["gain_hi"] - table["gain"]) * 100,
                arrayminus=(table["gain"] - table["gain_lo"]) * 100,
            ),
            marker_color=model_color(SMELT),
            hovertemplate="%{x}: %{y:.2f}%<extra></extra>",
        )
    )
    fig.add_hline(y=0, line_color="#888")
    fig.update_layout(
        title=title,
        yaxis_title="gain of SMELT over Baseline (% CE)",
        xaxis_title=key.replace("_", " "),
        template="plotly_white",
    )
    return fig


def dyck_by_demos(table: pd.DataFrame) -> go.Figure:
    """Exact match of both models against the number of demonstrations."""
    fig = go.Figure()
    for arch in ARCHS:
        fig.add_trace(
            go.Scatter(
                x=table["n_demos"],
                y=table[f"acc_{arch}"] * 100,
                name=arch,
                mode="lines+markers",
                line_color=model_color(arch),
            )
        )
    fig.update_layout(
        title="Dyck exact match by in-context examples",
        xaxis_title="demonstrations",
        yaxis_title="exact match (%)",
        template="plotly_white",
    )
    return fig


def report_html(report: DownstreamReport) -> str:
    """One self-contained HTML page with the three figures."""
    figures = [
        gain_bars(report.by_domain, "domain", "Cross-entropy gain by domain"),
        gain_bars(report.by_length, report.length_key, "Cross-entropy gain by length"),
    ]
    if len(report.by_demos):  # a BPE pair on shards has no in-context Dyck examples
        figures.append(dyck_by_demos(report.by_demos))
    return html_page("smelt-interp downstream", figures)
