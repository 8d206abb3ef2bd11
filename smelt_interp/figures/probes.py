"""A probe's figures from its spec: each `FigureSpec` names a renderer here (`kind`), the probe
table it draws and a title, so the report, the notebooks and the dashboard draw every
registered probe the same way without naming it.

    probe_figures(get("sink"), {"smelt": smelt_tables, "baseline": baseline_tables})

A renderer takes {model label: the figure's table for that model} and the FigureSpec and
returns one figure; `render` picks the table and, for a `per_model` spec, calls the renderer
once per model with the title "<model>: <title>". "by_depth" draws any column (`y`) of a
per-(layer, visit) table against effective depth, so a new probe needs no edit here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import pandas as pd
import plotly.graph_objects as go

from smelt_interp.figures import dyck, loop, patching
from smelt_interp.figures.theme import PAPER_COLOR, model_color, style
from smelt_interp.measure.case_heads import answer_mass
from smelt_interp.probes.registry import FigureSpec, ProbeSpec, Tables

Frames = Mapping[str, pd.DataFrame]
Renderer = Callable[[Frames, FigureSpec], go.Figure]


def _one(frames: Frames, figure: FigureSpec) -> tuple[str, pd.DataFrame]:
    """The single model a one-model renderer draws."""
    if len(frames) != 1:
        raise ValueError(f"{figure.kind} draws one model at a time; set per_model=True")
    return next(iter(frames.items()))


def _by_depth(frames: Frames, figure: FigureSpec) -> go.Figure:
    if figure.y is None:
        raise ValueError(f"a by_depth figure needs the column to draw (y) ({figure.title!r})")
    return loop.by_depth(frames, figure.y, title=figure.title)


def _expert_usage(frames: Frames, figure: FigureSpec) -> go.Figure:
    return loop.expert_usage(_one(frames, figure)[1], title=figure.title)


def _qkv_similarity(frames: Frames, figure: FigureSpec) -> go.Figure:
    label, heads = _one(frames, figure)
    return loop.qkv_similarity(heads, model=label, title=figure.title)


def _ablation_accuracy(frames: Frames, figure: FigureSpec) -> go.Figure:
    """Answer accuracy of each run of the head ablation (clean, then each role's heads
    ablated), one bar group per model, with chance dotted."""
    fig = go.Figure()
    for i, (label, runs) in enumerate(frames.items()):
        drawn = runs.dropna(subset=["answer_acc"])
        fig.add_trace(
            go.Bar(
                x=drawn["run"],
                y=drawn["answer_acc"],
                name=label,
                marker_color=model_color(label, i),
            )
        )
        fig.add_hline(y=float(runs["chance"].iloc[0]), line=dict(color=PAPER_COLOR, dash="dot"))
    fig.update_yaxes(title_text="answer accuracy", range=[0, 1.02])
    return style(fig, title=figure.title)


def _answer_masses(frames: Frames) -> dict[str, pd.DataFrame]:
    return {label: answer_mass(visits) for label, visits in frames.items()}


RENDERERS: dict[str, Renderer] = {
    "by_depth": _by_depth,
    "sink_by_depth": lambda frames, f: loop.sink_by_depth(frames, title=f.title),
    "routing_overlap": lambda frames, f: loop.routing_overlap(frames, title=f.title),
    "expert_usage": _expert_usage,
    "qkv_similarity": _qkv_similarity,
    "residual_writes": lambda frames, f: loop.residual_writes(frames, title=f.title),
    "lens_ce": lambda frames, f: loop.lens_ce(frames, title=f.title),
    "case_mass": lambda frames, f: dyck.mass_by_depth(_answer_masses(frames), title=f.title),
    "case_paper": lambda frames, f: dyck.paper_comparison(_answer_masses(frames), title=f.title),
    "ablation_accuracy": _ablation_accuracy,
    "patching_heads": lambda frames, f: patching.effect_heatmap(_one(frames, f)[1], title=f.title),
}


def render(figure: FigureSpec, tables_by_model: Mapping[str, Tables]) -> list[go.Figure]:
    """The figure(s) of one FigureSpec: one, or one per model for a per_model spec. Models
    whose tables lack `figure.table` are left out."""
    if figure.kind not in RENDERERS:
        raise ValueError(f"no renderer {figure.kind!r}; known: {', '.join(RENDERERS)}")
    draw = RENDERERS[figure.kind]
    frames = {
        label: tables[figure.table]
        for label, tables in tables_by_model.items()
        if figure.table in tables
    }
    if not figure.per_model:
        return [draw(frames, figure)]
    return [
        draw({label: frame}, dataclasses.replace(figure, title=f"{label}: {figure.title}"))
        for label, frame in frames.items()
    ]


def probe_figures(spec: ProbeSpec, tables_by_model: Mapping[str, Tables]) -> list[go.Figure]:
    """Every figure of `spec`, in order, from {model label: that model's tables as spec.run
    returned them}; none when no model has tables (the probe applied to none)."""
    if not tables_by_model:
        return []
    return [fig for figure in spec.figures for fig in render(figure, tables_by_model)]
