"""Figures of probe results: plain functions taking the probes' DataFrames (optionally stacked
over models with a `model` column) and returning `plotly.graph_objects.Figure`, shared by the
report, notebooks and the dashboard (no Dash here). Effective depth is the x axis wherever
the statistic is per (layer, visit), so a loop shows as the second pass over the same layers.
Colours per model and markers per visit come from `figures.theme`; the attention-pattern
figures (one head with token labels, a grid of heads) live in `figures.attention` and are
re-exported here as `pattern_heatmap` and `head_grid`."""
from __future__ import annotations

from typing import Iterator

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from smelt_interp.figures.attention import head_grid, head_heatmap as pattern_heatmap
from smelt_interp.figures.theme import PAPER_COLOR, ROUTING_SCALE, model_color, style, visit_dash, visit_symbol

__all__ = ["sink_by_depth", "routing_overlap", "expert_usage", "similarity_bars", "residual_norms",
           "dyck_mass", "lens_ce", "pattern_heatmap", "head_grid"]


def _by_model(df: pd.DataFrame) -> Iterator[tuple[int, str, pd.DataFrame]]:
    """(index, label, rows) per model; a frame without a `model` column is one unnamed model."""
    if "model" not in df.columns:
        yield 0, "", df
        return
    for i, label in enumerate(pd.unique(df["model"])):
        yield i, str(label), df[df["model"] == label]


def _name(*parts: object) -> str:
    return ", ".join(str(p) for p in parts if p != "")


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    fig.update_layout(xaxis_title=x, yaxis_title=y)   # the primary axes only
    return style(fig, title=title)


def _symbols(visits: pd.Series) -> list[str]:
    return [visit_symbol(int(v)) for v in visits]


def _depth_hover(rows: pd.DataFrame) -> list[str]:
    return [f"layer {layer}, visit {visit}" for layer, visit in zip(rows["layer"], rows["visit"])]


def sink_by_depth(sink: pd.DataFrame) -> go.Figure:
    """Mean sink mass over heads by effective depth, one line per model; markers by visit.
    Takes the sink probe's `visits` or `heads` table."""
    fig = go.Figure()
    keys = [k for k in ("model", "layer", "visit", "depth") if k in sink.columns]
    if "head" in sink.columns:
        sink = sink.groupby(keys, as_index=False, sort=False)["sink_mass"].mean()
    for i, label, rows in _by_model(sink):
        rows = rows.sort_values("depth")
        fig.add_trace(go.Scatter(x=rows["depth"], y=rows["sink_mass"], mode="lines+markers", name=_name(label) or "sink mass",
                                 line=dict(color=model_color(label, i)), hovertext=_depth_hover(rows),
                                 marker=dict(symbol=_symbols(rows["visit"]), size=9)))
    fig.add_hline(y=0.3, line_dash="dot", line_color=PAPER_COLOR, annotation_text="sink threshold 0.3")
    return _layout(fig, "Attention-sink mass by effective depth (marker: visit)", "effective depth", "mass on BOS")


def routing_overlap(overlap: pd.DataFrame) -> go.Figure:
    """Mean routing overlap per looped layer beside the chance level k^2/E (per model)."""
    fig = go.Figure()
    for i, label, rows in _by_model(overlap):
        fig.add_trace(go.Bar(x=[f"layer {layer}" for layer in rows["layer"]], y=rows["overlap"],
                             name=_name(label, "overlap"), marker_color=model_color(label, i)))
        fig.add_trace(go.Scatter(x=[f"layer {layer}" for layer in rows["layer"]], y=rows["chance"], mode="lines+markers",
                                 name=_name(label, "chance k²/E"), line=dict(color=model_color(label, i), dash="dash")))
    k = int(overlap["top_k"].max()) if len(overlap) else 0
    fig.update_yaxes(range=[0, k])
    return _layout(fig, "Experts shared by the two visits' top-k sets", "looped layer", f"shared experts (of {k})")


def expert_usage(usage: pd.DataFrame) -> go.Figure:
    """Share of routed slots per expert (columns) at every (layer, visit) (rows), first model."""
    _, label, rows = next(_by_model(usage))
    table = rows.pivot_table(index="depth", columns="expert", values="share")
    names = rows.drop_duplicates("depth").set_index("depth").loc[table.index]
    fig = go.Figure(go.Heatmap(z=table.to_numpy(), x=[f"e{e}" for e in table.columns],
                               y=[f"L{l} v{v}" for l, v in zip(names["layer"], names["visit"])],
                               colorscale=ROUTING_SCALE, colorbar=dict(title="share")))
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, _name("Expert usage per visit", label), "expert", "layer, visit (execution order)")


def similarity_bars(sim: pd.DataFrame) -> go.Figure:
    """Q/K/V cosine and top-k attended-key overlap between visits, beside the consecutive-layer
    control, averaged over layers and heads (per model)."""
    top = next((c for c in sim.columns if c.startswith("ctrl_top")), "ctrl_top8_overlap")[len("ctrl_"):]
    stats = ["cos_q", "cos_k", "cos_v", top]
    fig = go.Figure()
    for i, label, rows in _by_model(sim):
        if stats[0] in rows and rows[stats[0]].notna().any():
            fig.add_trace(go.Bar(x=stats, y=[rows[s].mean() for s in stats], name=_name(label, "visit 0 vs 1"),
                                 marker_color=model_color(label, i)))
        fig.add_trace(go.Bar(x=stats, y=[rows["ctrl_" + s].mean() for s in stats], name=_name(label, "control l vs l+1"),
                             marker_color=model_color(label, i), marker_pattern_shape="/", opacity=0.6))
    fig.update_layout(barmode="group")
    return _layout(fig, "Similarity of the two visits, with the consecutive-layer control", "statistic", "mean")


def residual_norms(writes: pd.DataFrame, relative: bool = True) -> go.Figure:
    """Attention and MoE write norms by effective depth (relative to the residual, or absolute)."""
    col = "relative" if relative else "write_norm"
    fig = go.Figure()
    for i, label, rows in _by_model(writes):
        for j, (sub, part) in enumerate(rows.groupby("sublayer", sort=False)):
            part = part.sort_values("depth")
            fig.add_trace(go.Scatter(x=part["depth"], y=part[col], mode="lines+markers", name=_name(label, sub),
                                     line=dict(color=model_color(label, i), dash=visit_dash(j)), hovertext=_depth_hover(part),
                                     marker=dict(symbol=_symbols(part["visit"]), size=8)))
    return _layout(fig, "Residual writes by effective depth (marker: visit)", "effective depth",
                   "‖write‖ / ‖residual‖" if relative else "‖write‖")


def dyck_mass(visits: pd.DataFrame, n_demos: int | None = None) -> go.Figure:
    """Attention from Dyck answer positions onto BOS and onto demonstration answers by effective
    depth (mean over heads; over prompts with demonstrations unless `n_demos` is given)."""
    if n_demos is not None:
        visits = visits[visits["n_demos"] == n_demos]
    elif (visits["n_demos"] > 0).any():
        visits = visits[visits["n_demos"] > 0]
    keys = [k for k in ("model", "layer", "visit", "depth") if k in visits.columns]
    visits = visits.groupby(keys, as_index=False, sort=False)[["bos_mass", "demo_mass"]].mean()
    fig = go.Figure()
    for i, label, rows in _by_model(visits):
        rows = rows.sort_values("depth")
        for j, (col, what) in enumerate((("bos_mass", "BOS"), ("demo_mass", "demo answers"))):
            fig.add_trace(go.Scatter(x=rows["depth"], y=rows[col], mode="lines+markers", name=_name(label, what),
                                     line=dict(color=model_color(label, i), dash=visit_dash(j)), hovertext=_depth_hover(rows),
                                     marker=dict(symbol=_symbols(rows["visit"]), size=8)))
    return _layout(fig, "Dyck: attention from answer positions (marker: visit)", "effective depth", "attention mass")


def lens_ce(depths: pd.DataFrame) -> go.Figure:
    """Logit-lens cross-entropy by effective depth (per model), loop boundaries marked, with the
    Dyck teacher-forced exact match on a second axis when present."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for i, label, rows in _by_model(depths):
        rows = rows.sort_values("depth")
        fig.add_trace(go.Scatter(x=rows["depth"], y=rows["ce"], mode="lines+markers", name=_name(label, "CE"),
                                 line=dict(color=model_color(label, i)), hovertext=_depth_hover(rows)), secondary_y=False)
        if "dyck_exact" in rows:
            fig.add_trace(go.Scatter(x=rows["depth"], y=rows["dyck_exact"], mode="lines+markers",
                                     name=_name(label, "Dyck exact"), line=dict(color=model_color(label, i), dash="dot")),
                          secondary_y=True)
        for d in rows.loc[rows["loop_boundary"].astype(bool), "depth"]:
            fig.add_vline(x=d, line_dash="dot", line_color=model_color(label, i), opacity=0.5)
    fig.update_yaxes(title_text="Dyck exact match", secondary_y=True, range=[0, 1])
    return _layout(fig, "Logit lens by effective depth (dotted: end of a loop pass)", "effective depth", "cross-entropy")
