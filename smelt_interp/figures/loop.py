"""Figures of what changes between the visits of a looped layer, built from the probes' tidy
tables (smelt_interp.probes.*): sink mass by effective depth, routing overlap with its chance
level, expert usage per visit, one token's experts in each visit, Q/K/V similarity and top-8
overlap against their controls, residual write norms and the logit lens by effective depth.
Pure plotly; several models at once are passed as {model name: table}. `shade_passes` and
`by_visit_lines` are the building blocks of every by-depth figure (figures.dyck uses them too);
`by_depth` draws any column of a per-(layer, visit) table that way. The paper's ranges come
from smelt_interp.paper."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from smelt_interp import paper
from smelt_interp.config import SMELT
from smelt_interp.figures.theme import (
    PAPER_COLOR,
    ROUTING_SCALE,
    message_figure,
    model_color,
    style,
    visit_dash,
    visit_symbol,
)


def _second_pass(frame: pd.DataFrame) -> tuple[float, float] | None:
    """Effective-depth range of visits >= 1, for shading."""
    later = frame.loc[frame["visit"] > 0, "depth"]
    return (float(later.min()) - 0.5, float(later.max()) + 0.5) if len(later) else None


def shade_passes(fig: go.Figure, frames: Mapping[str, pd.DataFrame], **where) -> None:
    """Shade the second pass (visits >= 1) of the first looped model among `frames`; `where`
    (row=, col=) picks a subplot."""
    for frame in frames.values():
        span = _second_pass(frame)
        if span:
            # exclude_empty_subplots=False: shade a subplot even before its lines are drawn
            fig.add_vrect(
                x0=span[0],
                x1=span[1],
                fillcolor="#fde8e1",
                opacity=0.5,
                line_width=0,
                layer="below",
                exclude_empty_subplots=False,
                **where,
            )
            break


def _gapped(part: pd.DataFrame, columns: Sequence[str]) -> dict[str, list]:
    """Columns of `part` (sorted by depth) with a None row wherever depth jumps, so a visit's
    line breaks instead of crossing the other visits' depths."""
    out: dict[str, list] = {c: [] for c in columns}
    prev = None
    for _, row in part.iterrows():
        if prev is not None and row["depth"] - prev > 1:
            for c in columns:
                out[c].append(None)
        for c in columns:
            out[c].append(row[c])
        prev = row["depth"]
    return out


def by_visit_lines(
    fig: go.Figure,
    frames: Mapping[str, pd.DataFrame],
    column: str,
    label: str,
    *,
    legend: bool = True,
    suffix: str = "",
    faint: bool = False,
    **where,
) -> None:
    """One line per (model, visit): x = effective depth, y = `column`, broken where the visit
    skips depths (SMELT's visit 0 before and after the loop). `suffix` follows the model's name
    in the legend and `faint` draws thin lines: a second quantity beside the first."""
    for i, (name, frame) in enumerate(frames.items()):
        if column not in frame:
            continue
        for visit, part in frame.sort_values("depth").groupby("visit"):
            cols = _gapped(part, ["depth", column, "layer"])
            fig.add_trace(
                go.Scatter(
                    x=cols["depth"],
                    y=cols[column],
                    customdata=cols["layer"],
                    mode="lines+markers",
                    name=f"{name}{suffix} · visit {visit}",
                    legendgroup=f"{name}{suffix}{visit}",
                    showlegend=legend,
                    line=dict(
                        color=model_color(name, i),
                        dash=visit_dash(int(visit)),
                        width=1 if faint else 2,
                    ),
                    marker=dict(
                        symbol="x" if faint else visit_symbol(int(visit)), size=6 if faint else 8
                    ),
                    connectgaps=False,
                    hovertemplate=(
                        f"<b>{name}{suffix}</b> layer %{{customdata}} visit {visit}<br>"
                        f"depth %{{x}}<br>{label} %{{y:.3f}}<extra></extra>"
                    ),
                ),
                **where,
            )


def by_depth(
    frames: Mapping[str, pd.DataFrame],
    column: str,
    *,
    label: str | None = None,
    axis_title: str | None = None,
    title: str | None = None,
) -> go.Figure:
    """`column` of per-(layer, visit) tables (layer, visit, depth, column) by effective depth,
    one line per (model, visit), the second pass shaded. `label` names the value in hovers
    (default: the column, spaced), `axis_title` the y axis (default: the label)."""
    if not frames:
        return message_figure("no models")
    label = label or column.replace("_", " ")
    fig = go.Figure()
    shade_passes(fig, frames)
    by_visit_lines(fig, frames, column, label)
    fig.update_xaxes(title_text="effective depth (execution order)", dtick=1)
    fig.update_yaxes(title_text=axis_title or label, rangemode="tozero")
    return style(fig, title=title, height=400)


def sink_by_depth(frames: Mapping[str, pd.DataFrame], *, title: str | None = None) -> go.Figure:
    """Mean sink mass over heads by effective depth, one line per (model, visit); frames are
    probes.sink.by_visit tables (layer, visit, depth, sink_mass). The second pass is shaded. A
    model with learned sinks (a sink_slot_mass column) has its slot's mass beside, in thin
    lines: the same mechanism as a BOS sink, held by a parameter."""
    slots = any("sink_slot_mass" in frame for frame in frames.values())
    axis = "sink mass (BOS; thin: learned sink)" if slots else "sink mass (attention on BOS)"
    fig = by_depth(frames, "sink_mass", axis_title=axis, title=title)
    if slots:
        label = "learned-sink mass"
        by_visit_lines(fig, frames, "sink_slot_mass", label, suffix=" sink", faint=True)
    return fig


def routing_overlap(frames: Mapping[str, pd.DataFrame], *, title: str | None = None) -> go.Figure:
    """Mean experts shared by consecutive visits per looped layer (probes.routing.measure),
    with the chance level (sum_e k^2 u0(e) u1(e), from the visits' usage) as a tick on each bar."""
    frames = {n: f for n, f in frames.items() if f is not None and len(f)}
    if not frames:
        return message_figure("no looped model: routing overlap compares two visits of a layer")
    fig = go.Figure()
    top_k = 1
    for i, (name, frame) in enumerate(frames.items()):
        x = [f"layer {r.layer} (v{r.visit}↔v{r.other_visit})" for r in frame.itertuples()]
        top_k = max(top_k, int(frame["top_k"].max()))
        fig.add_trace(
            go.Bar(
                x=x,
                y=frame["overlap"],
                name=f"{name}",
                marker_color=model_color(name, i),
                text=[f"{v:.2f} of {k}" for v, k in zip(frame["overlap"], frame["top_k"])],
                textposition="outside",
                hovertemplate="%{x}<br>shared experts %{y:.3f}<extra>" + name + "</extra>",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=frame["chance"],
                mode="markers",
                name=f"chance from expert usage ({name})",
                marker=dict(symbol="line-ew", size=60, line=dict(width=3, color="#374151")),
                hovertemplate="chance %{y:.3f}<extra></extra>",
            )
        )
    fig.update_yaxes(title_text="shared experts between visits", range=[0, top_k * 1.15])
    fig.update_layout(barmode="group", bargap=0.35)
    return style(fig, title=title, height=400)


def _visit_rows(frame: pd.DataFrame) -> list[str]:
    keys = frame[["depth", "layer", "visit"]].drop_duplicates().sort_values("depth")
    return [f"L{r.layer} · v{r.visit}" for r in keys.itertuples()]


def expert_usage(usage: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Share of routed slots per expert, one row per (layer, visit) in execution order
    (probes.routing.tables(...)['usage'])."""
    if usage is None or not len(usage):
        return message_figure("no expert usage")
    table = usage.pivot_table(index="depth", columns="expert", values="share").sort_index()
    rows = _visit_rows(usage)
    n_experts = table.shape[1]
    fig = go.Figure(
        go.Heatmap(
            z=table.to_numpy(),
            x=[f"E{e}" for e in table.columns],
            y=rows,
            colorscale=ROUTING_SCALE,
            zmin=0,
            texttemplate="%{z:.2f}",
            colorbar=dict(title=dict(text="share"), thickness=12),
            hovertemplate="%{y}, expert %{x}<br>share %{z:.3f}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(side="top", type="category")
    fig.add_annotation(
        text=f"uniform = 1/E = {1 / n_experts:.3f}",
        xref="paper",
        yref="paper",
        x=1,
        y=-0.08,
        showarrow=False,
        font=dict(size=11, color=PAPER_COLOR),
        xanchor="right",
    )
    return style(fig, title=title, height=max(300, 34 * len(rows) + 120), legend=False)


def token_routing(
    schedule: Sequence[tuple[int, int]],
    indices: np.ndarray,
    weights: np.ndarray,
    n_experts: int,
    *,
    title: str | None = None,
) -> go.Figure:
    """One token's routing: for each (layer, visit) in execution order (rows), the weight of each
    chosen expert (columns; blank where not chosen). indices/weights: [len(schedule), top_k]."""
    z = np.full((len(schedule), n_experts), np.nan)
    for row, (idx, w) in enumerate(zip(indices, weights)):
        for e, weight in zip(idx, w):
            z[row, int(e)] = float(weight)
    rows = [f"L{layer} · v{visit}" for layer, visit in schedule]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[f"E{e}" for e in range(n_experts)],
            y=rows,
            zmin=0,
            zmax=1,
            colorscale=ROUTING_SCALE,
            texttemplate="%{z:.2f}",
            colorbar=dict(title=dict(text="weight"), thickness=12),
            hovertemplate="%{y}, expert %{x}<br>weight %{z:.3f}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(side="top", type="category")
    style(fig, title=title, height=max(300, 34 * len(rows) + 120), legend=False)
    fig.update_layout(plot_bgcolor="#f9fafb")
    return fig


_SIM_PANELS = (
    ("cos_q", "Q cosine"),
    ("cos_k", "K cosine"),
    ("cos_v", "V cosine"),
    ("top8_overlap", "top-8 attended overlap"),
)


def qkv_similarity(
    heads: pd.DataFrame, *, model: str = SMELT, title: str | None = None
) -> go.Figure:
    """Per looped layer, head-averaged Q/K/V cosine and top-8 attended-key overlap between the
    visits (model colour) beside the control, layer l vs l + 1 (grey); the paper's range as a
    band (probes.similarity.measure)."""
    if heads is None or not len(heads):
        return message_figure("no similarity table")
    means = heads.groupby("layer", as_index=False).mean(numeric_only=True)
    fig = make_subplots(
        rows=1,
        cols=4,
        subplot_titles=[t for _, t in _SIM_PANELS],
        shared_yaxes=True,
        horizontal_spacing=0.03,
    )
    x = [f"L{layer}" for layer in means["layer"]]
    for col, (stat, _) in enumerate(_SIM_PANELS, start=1):
        if stat in means:
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=means[stat],
                    name="visit 0 vs visit 1",
                    legendgroup="loop",
                    showlegend=col == 1,
                    marker_color=model_color(model),
                    hovertemplate="%{x} visit 0 vs 1: %{y:.3f}<extra></extra>",
                ),
                row=1,
                col=col,
            )
        if "ctrl_" + stat in means:
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=means["ctrl_" + stat],
                    name="control: layer l vs l+1",
                    legendgroup="ctrl",
                    showlegend=col == 1,
                    marker_color="#9ca3af",
                    hovertemplate="%{x} vs next layer: %{y:.3f}<extra></extra>",
                ),
                row=1,
                col=col,
            )
        bands = (
            (paper.SIMILARITY.get(stat), model_color(model)),
            (paper.SIMILARITY_CONTROL.get(stat), "#6b7280"),
        )
        for ref, color in bands:
            if ref:
                fig.add_hrect(
                    y0=ref.lo,
                    y1=ref.hi,
                    fillcolor=color,
                    opacity=0.12,
                    line_width=0,
                    row=1,
                    col=col,
                )
    fig.update_yaxes(
        range=[min(0.0, float(np.nanmin(means.select_dtypes("number").to_numpy())) - 0.05), 1.05]
    )
    fig.update_layout(barmode="group", bargap=0.3)
    return style(fig, title=title, height=420, panels=True)


def residual_writes(
    frames: Mapping[str, pd.DataFrame], *, value: str = "relative", title: str | None = None
) -> go.Figure:
    """Norm of the attention and MoE writes by effective depth, one line per (model, visit)
    (probes.residual.measure); `value` is 'relative' (write / residual) or 'write_norm'."""
    if not frames:
        return message_figure("no models")
    label = "write / residual norm" if value == "relative" else "write norm"
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=["attention write", "MoE write"],
        shared_yaxes=True,
        horizontal_spacing=0.04,
    )
    for col, sub in enumerate(("attn", "mlp"), start=1):
        parts = {name: frame[frame["sublayer"] == sub] for name, frame in frames.items()}
        shade_passes(fig, parts, row=1, col=col)
        by_visit_lines(fig, parts, value, label, legend=col == 1, row=1, col=col)
        fig.update_xaxes(title_text="effective depth", dtick=1, row=1, col=col)
    if value == "relative":  # the first layer's writes dwarf the rest: compare on a log axis
        fig.update_yaxes(
            type="log", dtick=1, minor=dict(dtick="D1", showgrid=True, gridcolor="#f3f4f6")
        )
    else:
        fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text=label + (" (log)" if value == "relative" else ""), row=1, col=1)
    return style(fig, title=title, height=420, panels=True)


def lens_ce(frames: Mapping[str, pd.DataFrame], *, title: str | None = None) -> go.Figure:
    """Logit-lens cross-entropy by effective depth, one line per (model, visit), second pass
    shaded; beside it the Dyck teacher-forced exact match at the answers when every table has
    `dyck_exact` (probes.lens.run(...)['depths'])."""
    if not frames:
        return message_figure("no models")
    panels = [("ce", "cross-entropy")]
    if all("dyck_exact" in frame for frame in frames.values()):
        panels.append(("dyck_exact", "Dyck exact match"))
    fig = make_subplots(
        rows=1, cols=len(panels), subplot_titles=[t for _, t in panels], horizontal_spacing=0.08
    )
    for col, (stat, label) in enumerate(panels, start=1):
        by_visit_lines(fig, frames, stat, label, legend=col == 1, row=1, col=col)
        shade_passes(fig, frames, row=1, col=col)
        fig.update_xaxes(title_text="effective depth", dtick=1, row=1, col=col)
    fig.update_yaxes(title_text="logit-lens cross-entropy", row=1, col=1)
    if len(panels) > 1:
        fig.update_yaxes(title_text="answer exact match", range=[0, 1.02], row=1, col=2)
    return style(fig, title=title, height=400, panels=True)
