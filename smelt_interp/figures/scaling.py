"""Figures for scaling-law fits: loss against compute with the frontier, compute savings, and
fit residuals. Plain functions returning `plotly.graph_objects.Figure`, shared by the
command line, notebooks and the dashboard (no Dash here), in the models' colours of
figures/theme.py."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from smelt_interp.analysis.scaling import ScalingFit, frontier
from smelt_interp.config import SMELT
from smelt_interp.errors import FitError
from smelt_interp.figures.page import html_page
from smelt_interp.figures.theme import model_color
from smelt_interp.files import atomic_write_text


def _compute_grid(runs: pd.DataFrame | None, budgets: Iterable[float] | None) -> np.ndarray:
    """200 log-spaced compute values spanning the runs' C = F * D and the budgets, a fifth of
    a decade beyond each end (1e15..1e23 when there are neither)."""
    C_all = []
    if runs is not None and len(runs):
        C_all.append((runs["F"].astype(float) * runs["D"].astype(float)).to_numpy())
    if budgets is not None:
        C_all.append(np.asarray(list(budgets), dtype=float))
    if C_all:
        C_all = np.concatenate(C_all)
        lo, hi = np.log10(C_all.min()) - 0.2, np.log10(C_all.max()) + 0.2
    else:
        lo, hi = 15.0, 23.0
    return np.logspace(lo, hi, 200)


def _add_band(fig: go.Figure, f: ScalingFit, grid: np.ndarray, name: str, color: str) -> None:
    """The bootstrap laws' frontier losses at `ci_level` as a shaded band (none if all fail)."""
    curves = []
    for law in f.bootstrap:
        try:
            curves.append(law.optimal_loss(grid, f.S_ref))
        except FitError:
            pass
    if curves:
        q_lo, q_hi = np.nanquantile(
            np.array(curves), [(1 - f.ci_level) / 2, (1 + f.ci_level) / 2], axis=0
        )
        fig.add_trace(
            go.Scatter(
                x=np.concatenate([grid, grid[::-1]]),
                y=np.concatenate([q_hi, q_lo[::-1]]),
                fill="toself",
                fillcolor=color,
                opacity=0.15,
                line=dict(width=0),
                name=f"{name} {f.ci_level:.0%} band",
                legendgroup=name,
                hoverinfo="skip",
                showlegend=False,
            )
        )


def loss_vs_compute(
    fits: Mapping[str, ScalingFit],
    runs: pd.DataFrame | None = None,
    budgets: Iterable[float] | None = None,
    *,
    arch_column: str = "arch",
    band: bool = True,
) -> go.Figure:
    """Final loss against training compute C = F * D: each architecture's runs as points and
    its compute-optimal frontier L_opt(C) as a line (with a bootstrap band when available)."""
    fig = go.Figure()
    grid = _compute_grid(runs, budgets)

    for i, (name, f) in enumerate(fits.items()):
        color = model_color(name, i)
        if runs is not None and len(runs):
            own = (
                runs[runs[arch_column].astype(str) == name] if arch_column in runs.columns else runs
            )
            fig.add_trace(
                go.Scatter(
                    x=own["F"] * own["D"],
                    y=own["loss"],
                    mode="markers",
                    name=f"{name} runs",
                    legendgroup=name,
                    marker=dict(color=color, size=7, opacity=0.7),
                    customdata=np.stack([own["F"], own["D"], own["S"]], axis=1),
                    hovertemplate="C=%{x:.3g}<br>loss=%{y:.4f}<br>F=%{customdata[0]:.3g}"
                    "<br>D=%{customdata[1]:.3g}<br>S=%{customdata[2]:.3f}<extra></extra>",
                )
            )
        try:
            front = frontier(f, grid, verify=False)
        except FitError:
            continue
        if band and f.bootstrap:
            _add_band(fig, f, grid, name, color)
        fig.add_trace(
            go.Scatter(
                x=front["C"],
                y=front["L_opt"],
                mode="lines",
                name=f"{name} frontier (S={f.S_ref:.3g})",
                legendgroup=name,
                line=dict(color=color, width=2),
                customdata=np.stack([front["F_opt"], front["D_opt"]], axis=1),
                hovertemplate="C=%{x:.3g}<br>L_opt=%{y:.4f}<br>F_opt=%{customdata[0]:.3g}"
                "<br>D_opt=%{customdata[1]:.3g}<extra></extra>",
            )
        )
    fig.update_layout(
        title="Loss vs training compute, with the compute-optimal frontier",
        xaxis=dict(title="compute C = F · D (FLOPs)", type="log"),
        yaxis=dict(title="final loss", type="log"),
        template="plotly_white",
        legend=dict(groupclick="togglegroup"),
    )
    return fig


def savings_figure(
    savings: pd.DataFrame, *, title: str = "SMELT compute savings at equal loss"
) -> go.Figure:
    """Savings 1 - C_smelt / C against the Baseline budget C, with its bootstrap interval."""
    fig = go.Figure()
    x = savings["C"]
    finite = np.isfinite(savings["savings"])
    if {"savings_lo", "savings_hi"} <= set(savings.columns):
        ok = finite & np.isfinite(savings["savings_lo"]) & np.isfinite(savings["savings_hi"])
        fig.add_trace(
            go.Scatter(
                x=np.concatenate([x[ok], x[ok][::-1]]),
                y=100
                * np.concatenate([savings["savings_hi"][ok], savings["savings_lo"][ok][::-1]]),
                fill="toself",
                fillcolor=model_color(SMELT),
                opacity=0.2,
                line=dict(width=0),
                name="bootstrap interval",
                hoverinfo="skip",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=x[finite],
            y=100 * savings["savings"][finite],
            mode="lines+markers",
            name="savings",
            line=dict(color=model_color(SMELT)),
            hovertemplate="C=%{x:.3g}<br>savings=%{y:.1f}%<extra></extra>",
        )
    )
    fig.add_hline(y=0, line=dict(color="gray", dash="dot"))
    fig.update_layout(
        title=title,
        xaxis=dict(title="Baseline compute C (FLOPs)", type="log"),
        yaxis=dict(title="compute saved (%)"),
        template="plotly_white",
    )
    return fig


def residuals_figure(
    fits: Mapping[str, ScalingFit], runs: pd.DataFrame, *, arch_column: str = "arch"
) -> go.Figure:
    """Log-loss residuals (observed - fitted) against compute, per architecture."""
    fig = go.Figure()
    for i, (name, f) in enumerate(fits.items()):
        own = runs.loc[f.residuals.index]
        fig.add_trace(
            go.Scatter(
                x=own["F"] * own["D"],
                y=f.residuals,
                mode="markers",
                name=name,
                marker=dict(color=model_color(name, i)),
            )
        )
    fig.add_hline(y=0, line=dict(color="gray", dash="dot"))
    fig.update_layout(
        title="Fit residuals",
        xaxis=dict(title="compute C = F · D", type="log"),
        yaxis=dict(title="log(observed) - log(fitted)"),
        template="plotly_white",
    )
    return fig


def scaling_html(
    fits: Mapping[str, ScalingFit],
    runs: pd.DataFrame | None,
    budgets: Iterable[float] | None,
    savings: pd.DataFrame | None = None,
    *,
    arch_column: str = "arch",
) -> str:
    """One self-contained HTML page (plotly.js inlined) with the loss-vs-compute figure and,
    when given, the savings figure below it."""
    figs = [loss_vs_compute(fits, runs, budgets, arch_column=arch_column)]
    if savings is not None:
        figs.append(savings_figure(savings))
    return html_page("Scaling laws", figs)


def write_html(path: str | Path, *args: Any, **kwargs: Any) -> None:
    """`scaling_html(*args, **kwargs)` written atomically to `path`."""
    atomic_write_text(path, scaling_html(*args, **kwargs))
