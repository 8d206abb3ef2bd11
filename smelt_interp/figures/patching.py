"""Patching figures: the (layer x visit) by head heatmap of a patched effect, and activation
against attribution patching node by node (tables of measure.patch_tables). Pure plotly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from smelt_interp.figures.theme import style

EFFECT_SCALE = "RdBu"  # diverging: an edit that helps (red) or hurts (blue), white at 0
HOVER = "%{y}, head %{x}<br>effect %{z:.3f}<extra></extra>"


def effect_grid(
    frame: pd.DataFrame, column: str = "activation"
) -> tuple[list[str], list[int], np.ndarray]:
    """Row labels ('layer 1 · visit 0', in execution order), head numbers and the grid [rows,
    heads] of `column` from a per-(layer, visit, head) table (one position: all)."""
    heads = frame[frame["head"] >= 0]
    order = heads.sort_values(["depth", "head"]) if "depth" in heads else heads
    rows = list(dict.fromkeys(zip(order["layer"], order["visit"])))
    numbers = sorted(int(h) for h in order["head"].unique())
    grid = np.full((len(rows), len(numbers)), np.nan)
    index = {lv: i for i, lv in enumerate(rows)}
    for layer, visit, head, value in zip(
        order["layer"], order["visit"], order["head"], order[column]
    ):
        grid[index[layer, visit], numbers.index(int(head))] = value
    labels = [f"layer {layer} · visit {visit}" for layer, visit in rows]
    return labels, numbers, grid


def effect_heatmap(
    frame: pd.DataFrame,
    column: str = "activation",
    *,
    title: str | None = None,
    height: int | None = None,
) -> go.Figure:
    """(layer x visit) down in execution order, heads across: `column` of each head's node,
    on a diverging scale centred on 0 (0 = the corrupted run, 1 = the clean run)."""
    labels, numbers, grid = effect_grid(frame, column)
    bound = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0
    fig = go.Figure(
        go.Heatmap(
            z=grid,
            x=[str(h) for h in numbers],
            y=labels,
            colorscale=EFFECT_SCALE,
            reversescale=True,
            zmid=0.0,
            zmin=-max(bound, 1e-9),
            zmax=max(bound, 1e-9),
            hovertemplate=HOVER,
            colorbar=dict(title=dict(text="effect", side="right"), thickness=12),
        )
    )
    fig.update_xaxes(title_text="head", type="category", showgrid=False)
    fig.update_yaxes(type="category", autorange="reversed", showgrid=False)
    return style(fig, title=title, height=height or 120 + 34 * len(labels), legend=False)


def attribution_scatter(frame: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Each node's attribution estimate against its activation-patching effect, with y = x:
    points off the line are where the first-order estimate misses."""
    labels = [
        f"{int(r.layer)}.{int(r.visit)} h{int(r.head)}"
        if r.head >= 0
        else f"{int(r.layer)}.{int(r.visit)} {r.site}"
        for r in frame.itertuples()
    ]
    values = np.concatenate([frame["activation"].to_numpy(), frame["attribution"].to_numpy()])
    low, high = (float(values.min()), float(values.max())) if len(values) else (0.0, 1.0)
    fig = go.Figure(
        [
            go.Scatter(x=[low, high], y=[low, high], mode="lines", name="y = x",
                       line=dict(color="#8c8c8c", dash="dot")),
            go.Scatter(x=frame["activation"], y=frame["attribution"], mode="markers",
                       name="nodes", text=labels,
                       hovertemplate="%{text}<br>activation %{x:.3f}<br>attribution %{y:.3f}"
                       "<extra></extra>"),
        ]
    )  # fmt: skip
    fig.update_xaxes(title_text="activation patching effect")
    fig.update_yaxes(title_text="attribution patching estimate")
    return style(fig, title=title, legend=False)
