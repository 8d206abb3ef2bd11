"""Figures of the case study (the `case_study` probe, the trainer's case-study evaluation) for
both tasks, in-context associative recall and in-context Dyck. Shared by the dashboard's
case-study page, notebook 05 and the report. Pure plotly.

- `over_training`: per (layer, visit), BOS mass at non-answer positions and demonstration-answer
  mass at answer positions against tokens seen, one column per model, drawn from the trainer's
  long table (train.case_eval.case_table: step, tokens, layer, visit, head, statistic, value).
  Each line is the head with the largest value at that evaluation (the mechanism lives in one
  head; a mean over heads would dilute it); the hover names the head.
- `per_visit_aggregate`: the probe's `visits` masses and its `non_answer` BOS mass by
  effective depth with their bootstrap intervals.
- `answer_attention`: one head's attention from one answer position of an example row, with
  BOS and the demonstration answers marked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from smelt_interp.figures.loop import by_visit_lines, shade_passes
from smelt_interp.figures.theme import (
    PAPER_COLOR,
    message_figure,
    model_color,
    style,
    visit_dash,
    visit_symbol,
)

# the over-training figure's panels: (statistic of the long table, panel title)
TRAINING_PANELS = (
    ("bos_non_answer", "BOS mass at non-answer positions"),
    ("demo_answer", "demonstration-answer mass at answer positions"),
)
ACCURACY = (("answer_acc", "answer positions"), ("first_acc", "first occurrences"))
LAYER_COLORS = ("#4c78a8", "#e4572e", "#54a24b", "#b279a2", "#eeca3b", "#72b7b2", "#9d755d")
LONG_COLUMNS = ("step", "tokens", "layer", "visit", "head", "statistic", "value")


def layer_color(layer: int) -> str:
    return LAYER_COLORS[layer % len(LAYER_COLORS)]


def head_max(table: pd.DataFrame, statistic: str) -> pd.DataFrame:
    """Per (step, layer, visit), the head with the largest `statistic` in the trainer's long
    table: columns step, tokens, layer, visit, head, value, sorted by (layer, visit, step)."""
    missing = set(LONG_COLUMNS) - set(table.columns)
    if missing:
        raise ValueError(f"a case-study table needs columns {', '.join(sorted(missing))}")
    part = table[(table["statistic"] == statistic) & table["head"].notna()].dropna(subset=["value"])
    cols = ["step", "tokens", "layer", "visit", "head", "value"]
    if part.empty:
        return pd.DataFrame(columns=cols)
    best = part.loc[part.groupby(["step", "layer", "visit"])["value"].idxmax()]
    best = best.astype({"layer": int, "visit": int, "head": int})
    return best[cols].sort_values(["layer", "visit", "step"]).reset_index(drop=True)


def accuracy_history(table: pd.DataFrame, statistic: str) -> pd.DataFrame:
    """The rows of a model-wide statistic (answer_acc, first_acc): step, tokens, value."""
    part = table[table["statistic"] == statistic].dropna(subset=["value"])
    return part[["step", "tokens", "value"]].sort_values("step").reset_index(drop=True)


def over_training(tables: Mapping[str, pd.DataFrame], *, title: str | None = None) -> go.Figure:
    """{model: the trainer's case-study long table} -> rows: BOS mass at non-answer positions,
    demonstration-answer mass at answer positions (the max over heads per (layer, visit): one
    line per layer, visit 1 dashed) and accuracy; one column per model; x: tokens seen."""
    tables = {name: t for name, t in tables.items() if not t.empty}
    if not tables:
        return message_figure(
            "no case-study evaluations yet: a run trained on assoc_recall writes them to the "
            "metrics.jsonl beside its checkpoint"
        )
    names = list(tables)
    titles = [
        f"{name}: {label}" for _, label in (*TRAINING_PANELS, ("", "accuracy")) for name in names
    ]
    fig = make_subplots(
        rows=3,
        cols=len(names),
        subplot_titles=titles,
        shared_xaxes=True,
        vertical_spacing=0.09,
        horizontal_spacing=0.06,
    )
    shown: set[str] = set()
    for col, name in enumerate(names, start=1):
        table = tables[name]
        for row, (stat, label) in enumerate(TRAINING_PANELS, start=1):
            for (layer, visit), part in head_max(table, stat).groupby(["layer", "visit"]):
                key = f"layer {layer} · visit {visit}"
                fig.add_trace(
                    go.Scatter(
                        x=part["tokens"],
                        y=part["value"],
                        customdata=part[["head", "step"]].to_numpy(),
                        mode="lines+markers",
                        name=key,
                        legendgroup=key,
                        showlegend=key not in shown,
                        line=dict(color=layer_color(layer), dash=visit_dash(visit), width=2),
                        marker=dict(symbol=visit_symbol(visit), size=5),
                        hovertemplate=(
                            f"<b>{name}</b> {key}, head %{{customdata[0]}}<br>step "
                            f"%{{customdata[1]}}, %{{x:,}} tokens<br>{label} %{{y:.3f}}"
                            "<extra></extra>"
                        ),
                    ),
                    row=row,
                    col=col,
                )
                shown.add(key)
        for stat, label in ACCURACY:
            part = accuracy_history(table, stat)
            if part.empty:
                continue
            key = f"accuracy at {label}"
            fig.add_trace(
                go.Scatter(
                    x=part["tokens"],
                    y=part["value"],
                    mode="lines+markers",
                    name=key,
                    legendgroup=key,
                    showlegend=key not in shown,
                    line=dict(color=PAPER_COLOR if stat == "first_acc" else "#1f2430", width=2),
                    marker=dict(size=5),
                    hovertemplate=f"<b>{name}</b> {key}<br>%{{x:,}} tokens: %{{y:.3f}}"
                    "<extra></extra>",
                ),
                row=3,
                col=col,
            )
            shown.add(key)
    fig.update_yaxes(range=[0, 1.02])
    fig.update_xaxes(title_text="tokens seen", row=3)
    return style(
        fig,
        title=title or "Over training: per (layer, visit) the head with the largest value",
        height=760,
        panels=True,
    )


_AGGREGATE = (
    ("bos_mass", "answer positions: on BOS"),
    ("demo_mass", "answer positions: on demonstration answers"),
    ("bos_mass", "non-answer positions: on BOS, top head"),
)


def non_answer_top_head(non_answer: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, visit), the row of the probe's `non_answer` table whose head has the most
    BOS mass (the parked head), with its interval."""
    if non_answer.empty:
        return non_answer
    best = non_answer.loc[non_answer.groupby(["layer", "visit"])["bos_mass"].idxmax()]
    return best.sort_values("depth").reset_index(drop=True)


def _error_bars(fig: go.Figure, frame: pd.DataFrame, stat: str, color: str, **where) -> None:
    fig.add_trace(
        go.Scatter(
            x=frame["depth"],
            y=frame[stat],
            mode="markers",
            marker=dict(size=1, opacity=0),
            error_y=dict(
                type="data",
                array=frame[f"{stat}_hi"] - frame[stat],
                arrayminus=frame[stat] - frame[f"{stat}_lo"],
                color=color,
                thickness=1.5,
                width=4,
            ),
            showlegend=False,
            hoverinfo="skip",
        ),
        **where,
    )


def per_visit_aggregate(
    visits: Mapping[str, pd.DataFrame],
    non_answer: Mapping[str, pd.DataFrame],
    *,
    title: str | None = None,
) -> go.Figure:
    """Three panels by effective depth, one line per (model, visit) with 95% bootstrap
    intervals: the `visits` table's BOS and demonstration-answer masses at answer positions
    (head means, one n_demos), and the `non_answer` table's BOS mass of the head with the most."""
    if not visits:
        return message_figure("no models")
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=[t for _, t in _AGGREGATE], horizontal_spacing=0.05
    )
    sources = (visits, visits, {n: non_answer_top_head(f) for n, f in non_answer.items()})
    for col, ((stat, label), frames) in enumerate(zip(_AGGREGATE, sources), start=1):
        frames = {n: f for n, f in frames.items() if not f.empty}
        shade_passes(fig, frames, row=1, col=col)
        by_visit_lines(fig, frames, stat, label, legend=col == 1, row=1, col=col)
        for i, (name, frame) in enumerate(frames.items()):
            _error_bars(fig, frame, stat, model_color(name, i), row=1, col=col)
        fig.update_xaxes(title_text="effective depth", dtick=1, row=1, col=col)
    fig.update_yaxes(range=[0, 1.02])
    fig.update_yaxes(title_text="attention mass", row=1, col=1)
    return style(fig, title=title, height=400, panels=True)


def answer_attention(
    weights: np.ndarray,
    labels: Sequence[str],
    query: int,
    demos: Sequence[int],
    *,
    title: str | None = None,
) -> go.Figure:
    """One head's attention from query position `query` over keys 0..query (`weights`), one bar
    per key: BOS, the demonstration answers (`demos`) and the other keys in their own colours."""
    keys = np.arange(len(weights))
    kind = np.where(np.isin(keys, list(demos)), "demonstration answer", "other key")
    kind[0] = "BOS"
    fig = go.Figure()
    colors = {"BOS": "#1f2430", "demonstration answer": "#e4572e", "other key": "#b8c4d6"}
    for name, color in colors.items():
        where = kind == name
        fig.add_trace(
            go.Bar(
                x=keys[where],
                y=weights[where],
                name=f"{name} ({weights[where].sum():.2f})",
                marker_color=color,
                customdata=[labels[k] for k in keys[where]],
                hovertemplate="key %{x} (%{customdata}): %{y:.3f}<extra></extra>",
            )
        )
    fig.update_xaxes(title_text=f"key position (query {query}: {labels[query]})")
    fig.update_yaxes(title_text="attention weight", rangemode="tozero")
    fig.update_layout(bargap=0.1)
    return style(fig, title=title, height=320)
