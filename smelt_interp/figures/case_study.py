"""Figures of the case study (the `case_study` probe, the trainer's case-study evaluation) for
both tasks, in-context associative recall and in-context Dyck. Shared by the dashboard's
case-study page, notebook 05 and the report. Pure plotly.

- `over_training`: per (layer, visit) and head, BOS mass at answer positions, demonstration-answer
  mass at answer positions and BOS mass at non-answer positions against tokens seen, one
  column per model, drawn from the trainer's long table (train.case_eval.case_table: step,
  tokens, layer, visit, head, statistic, value). Every head is its own line (an envelope over
  heads would hide a head that parks on BOS and leaves again), with uniform attention's BOS
  level dotted.
- `per_visit_aggregate`: the probe's `visits` masses at the answer positions (head means, with
  the best head as markers) and BOS mass at the non-answer positions, by effective depth with
  their bootstrap intervals and uniform attention's levels.
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
from smelt_interp.measure import case_heads
from smelt_interp.measure.position_mass import key_set_masses

# the over-training figure's panels: (statistic of the long table, panel title); the paper's
# quantity first
TRAINING_PANELS = (
    ("bos_answer", "BOS mass at answer positions"),
    ("demo_answer", "demonstration-answer mass at answer positions"),
    ("bos_non_answer", "BOS mass at non-answer positions"),
)
BOS_PANELS = ("bos_answer", "bos_non_answer")  # where uniform attention's BOS level is drawn
ACCURACY = (("answer_acc", "answer positions"), ("first_acc", "first occurrences"))
LAYER_COLORS = ("#4c78a8", "#e4572e", "#54a24b", "#b279a2", "#eeca3b", "#72b7b2", "#9d755d")
LONG_COLUMNS = ("step", "tokens", "layer", "visit", "head", "statistic", "value")
REFERENCE_COLOR = PAPER_COLOR  # uniform attention's levels, dotted


def layer_color(layer: int) -> str:
    return LAYER_COLORS[layer % len(LAYER_COLORS)]


def _check_long(table: pd.DataFrame) -> None:
    missing = set(LONG_COLUMNS) - set(table.columns)
    if missing:
        raise ValueError(f"a case-study table needs columns {', '.join(sorted(missing))}")


def head_history(table: pd.DataFrame, statistic: str) -> pd.DataFrame:
    """Every head's `statistic` over the evaluations of the trainer's long table: columns step,
    tokens, layer, visit, head, value, sorted by (layer, visit, head, step)."""
    _check_long(table)
    part = table[(table["statistic"] == statistic) & table["head"].notna()].dropna(subset=["value"])
    cols = ["step", "tokens", "layer", "visit", "head", "value"]
    if part.empty:
        return pd.DataFrame(columns=cols)
    part = part.astype({"layer": int, "visit": int, "head": int})
    return part[cols].sort_values(["layer", "visit", "head", "step"]).reset_index(drop=True)


def head_max(table: pd.DataFrame, statistic: str) -> pd.DataFrame:
    """Per (step, layer, visit), the head with the largest `statistic` in the trainer's long
    table: columns step, tokens, layer, visit, head, value, sorted by (layer, visit, step)."""
    part = head_history(table, statistic)
    if part.empty:
        return part
    best = part.loc[part.groupby(["step", "layer", "visit"])["value"].idxmax()]
    return best.sort_values(["layer", "visit", "step"]).reset_index(drop=True)


def accuracy_history(table: pd.DataFrame, statistic: str) -> pd.DataFrame:
    """The rows of a model-wide statistic (answer_acc, first_acc): step, tokens, value."""
    part = table[table["statistic"] == statistic].dropna(subset=["value"])
    return part[["step", "tokens", "value"]].sort_values("step").reset_index(drop=True)


def _head_panels(
    fig: go.Figure, name: str, table: pd.DataFrame, col: int, level: float | None, shown: set
) -> None:
    """Column `col` of over_training's head panels: one line per head of each (layer, visit),
    and uniform attention's BOS share (`level`) dotted in the BOS panels."""

    for row, (stat, label) in enumerate(TRAINING_PANELS, start=1):
        history = head_history(table, stat)
        for (layer, visit, head), part in history.groupby(["layer", "visit", "head"]):
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
                    line=dict(color=layer_color(layer), dash=visit_dash(visit), width=1.5),
                    marker=dict(symbol=visit_symbol(visit), size=4),
                    hovertemplate=(
                        f"<b>{name}</b> {key}, head {head}<br>step "
                        f"%{{customdata[1]}}, %{{x:,}} tokens<br>{label} %{{y:.3f}}"
                        "<extra></extra>"
                    ),
                ),
                row=row,
                col=col,
            )
            shown.add(key)
        if stat in BOS_PANELS and level is not None and not history.empty:
            key = "uniform attention on BOS"
            fig.add_trace(
                go.Scatter(
                    x=[history["tokens"].min(), history["tokens"].max()],
                    y=[level, level],
                    mode="lines",
                    name=key,
                    legendgroup=key,
                    showlegend=key not in shown,
                    line=dict(color=REFERENCE_COLOR, dash="dot", width=1.5),
                    hovertemplate=f"<b>{name}</b> {key}: {level:.3f}<extra></extra>",
                ),
                row=row,
                col=col,
            )
            shown.add(key)


def _accuracy_panel(
    fig: go.Figure, name: str, table: pd.DataFrame, row: int, col: int, shown: set
) -> None:
    """over_training's accuracy panel of one model: a line per accuracy the trainer wrote."""
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
                hovertemplate=f"<b>{name}</b> {key}<br>%{{x:,}} tokens: %{{y:.3f}}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        shown.add(key)


def over_training(
    tables: Mapping[str, pd.DataFrame],
    *,
    uniform: Mapping[str, float] | None = None,
    title: str | None = None,
) -> go.Figure:
    """{model: the trainer's case-study long table} -> rows: BOS mass at answer positions,
    demonstration-answer mass at answer positions, BOS mass at non-answer positions (one line
    per head of each (layer, visit): colour by layer, visit 1 dashed, the hover names the head,
    so a head that parks on BOS and leaves again would show), then accuracy; one column per model;
    x: tokens seen. `uniform` ({model: uniform attention's BOS share on its rows}) is drawn
    dotted in the BOS panels."""
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
    n_rows = len(TRAINING_PANELS) + 1
    fig = make_subplots(
        rows=n_rows,
        cols=len(names),
        subplot_titles=titles,
        shared_xaxes=True,
        vertical_spacing=0.07,
        horizontal_spacing=0.06,
    )
    shown: set[str] = set()  # legend entries drawn once across the panels
    for col, name in enumerate(names, start=1):
        _head_panels(fig, name, tables[name], col, (uniform or {}).get(name), shown)
        _accuracy_panel(fig, name, tables[name], n_rows, col, shown)
    fig.update_yaxes(range=[0, 1.02])
    fig.update_xaxes(title_text="tokens seen", row=n_rows)
    return style(
        fig,
        title=title or "Over training: every head of every (layer, visit)",
        height=960,
        panels=True,
    )


_AGGREGATE = (
    ("bos_mass", "answer positions: on BOS"),
    ("demo_mass", "answer positions: on demonstration answers"),
    ("bos_mass", "non-answer positions: on BOS"),
)
# the reference level drawn in each panel of per_visit_aggregate: a key of `references`
_REFERENCE = (
    ("uniform_bos", "uniform attention: BOS"),
    ("demo_share", "uniform attention: demonstration answers (their share of keys)"),
    ("uniform_bos_non_answer", "uniform attention: BOS"),
)


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


def _best_heads(
    fig: go.Figure, frame: pd.DataFrame, stat: str, name: str, color: str, label: str, **where
) -> None:
    """Markers at each (layer, visit)'s best head (columns depth, visit, `stat`, and the head
    in `head` or `{stat}_best_head`), one trace per visit."""
    head = "head" if "head" in frame.columns else f"{stat}_best_head"
    value = stat if head == "head" else f"{stat}_best"
    for visit, part in frame.sort_values("depth").groupby("visit"):
        fig.add_trace(
            go.Scatter(
                x=part["depth"],
                y=part[value],
                customdata=np.stack([part["layer"], part[head]], axis=-1),
                mode="markers",
                name=f"{name} · visit {visit} · best head",
                legendgroup=f"{name}{visit}best",
                showlegend=False,
                marker=dict(symbol="star-open", size=10, color=color),
                hovertemplate=(
                    f"<b>{name}</b> layer %{{customdata[0]}} visit {visit}, best head "
                    f"%{{customdata[1]}}<br>{label} %{{y:.3f}}<extra></extra>"
                ),
            ),
            **where,
        )


def _reference_line(
    fig: go.Figure, depths: Sequence[float], level: float, label: str, legend: bool, **where
) -> None:
    fig.add_trace(
        go.Scatter(
            x=[min(depths) - 0.3, max(depths) + 0.3],
            y=[level, level],
            mode="lines",
            name=f"{label} {level:.3f}",
            legendgroup=label,
            showlegend=legend,
            line=dict(color=REFERENCE_COLOR, dash="dot", width=1.5),
            hovertemplate=f"{label}: {level:.3f}<extra></extra>",
        ),
        **where,
    )


def per_visit_aggregate(
    visits: Mapping[str, pd.DataFrame],
    views: Mapping[str, case_heads.HeadViews],
    *,
    references: Mapping[str, float] | None = None,
    faded: Sequence[str] = (),
    title: str | None = None,
) -> go.Figure:
    """Three panels by effective depth, one line per (model, visit): at the answer positions the
    `visits` table's BOS and demonstration-answer masses (head means, one n_demos, with 95%
    bootstrap intervals), then BOS mass at the non-answer positions (head mean; the head with
    the most, with its interval, as markers), from each model's case_heads.head_views of the
    same cut, whose `best` adds each (layer, visit)'s best head as star markers; `references` (keys
    uniform_bos, demo_share, uniform_bos_non_answer) draws uniform attention's levels dotted;
    the models in `faded` (not trained on the task shown) are drawn pale."""
    if not visits:
        return message_figure("no models")
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=[t for _, t in _AGGREGATE], horizontal_spacing=0.05
    )
    means = {n: v.non_answer_mean for n, v in views.items()}
    tops = {n: v.non_answer_top for n, v in views.items()}
    best = {n: v.best for n, v in views.items()}
    sources = (visits, visits, means)
    for col, ((stat, label), frames) in enumerate(zip(_AGGREGATE, sources), start=1):
        frames = {n: f for n, f in frames.items() if not f.empty}
        shade_passes(fig, frames, row=1, col=col)
        first = len(fig.data)
        by_visit_lines(fig, frames, stat, label, legend=col == 1, row=1, col=col)
        for i, (name, frame) in enumerate(frames.items()):
            color = model_color(name, i)
            if col < 3:
                _error_bars(fig, frame, stat, color, row=1, col=col)
                if name in best and not best[name].empty:
                    _best_heads(fig, best[name], stat, name, color, label, row=1, col=col)
            elif name in tops and not tops[name].empty:
                _best_heads(fig, tops[name], stat, name, color, label, row=1, col=col)
                _error_bars(fig, tops[name], stat, color, row=1, col=col)
        for trace in fig.data[first:]:
            if any(str(trace.name or "").startswith(f"{n} · ") for n in faded):
                trace.opacity = 0.45
        key, ref_label = _REFERENCE[col - 1]
        depths = [d for f in frames.values() for d in f["depth"]]
        if references is not None and key in references and depths:
            _reference_line(fig, depths, references[key], ref_label, col < 3, row=1, col=col)
        fig.update_xaxes(title_text="effective depth", dtick=1, row=1, col=col)
    fig.update_yaxes(range=[0, 1.02])
    fig.update_yaxes(title_text="attention mass", row=1, col=1)
    return style(fig, title=title, height=420, panels=True)


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
    masses = key_set_masses(weights, {name: keys[kind == name] for name in colors})
    for name, color in colors.items():
        where = kind == name
        fig.add_trace(
            go.Bar(
                x=keys[where],
                y=weights[where],
                name=f"{name} ({masses[name]:.2f})",
                marker_color=color,
                customdata=[labels[k] for k in keys[where]],
                hovertemplate="key %{x} (%{customdata}): %{y:.3f}<extra></extra>",
            )
        )
    fig.update_xaxes(title_text=f"key position (query {query}: {labels[query]})")
    fig.update_yaxes(title_text="attention weight", rangemode="tozero")
    fig.update_layout(bargap=0.1)
    return style(fig, title=title, height=320)
