"""The attention sink over training: Sink^0.3 (64-token windows; Gu et al.'s per-sample figure,
or the pooled one where a model's log predates it, for every model alike) by step and the mean
BOS mass by step in one small panel per (layer, visit), one line per model, so one sees when
the sink appears in each model and whether SMELT's second visit (visit 1 panels beside visit 0)
carries less of it. Drawn from train.sink_eval.sink_history tables; shared by the dashboard's
Overview page, notebook 02 and the report."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from smelt_interp.figures.theme import message_figure, model_color, style

COLUMNS = 4
SHARE_TITLE = "Sink^0.3 (Gu et al., per sample, 64-token windows)"
POOLED_TITLE = "pooled Sink^0.3 (rows pooled, 64-token windows)"


def share_column(histories: Mapping[str, pd.DataFrame]) -> tuple[str, str]:
    """(column, panel title) of the share panel: Gu et al.'s figure when every model logged it,
    else the pooled one, which every log carries (one statistic for all models on one axis)."""
    gu = all("sink03_gu" in h and h["sink03_gu"].notna().any() for h in histories.values())
    return ("sink03_gu", SHARE_TITLE) if gu else ("sink03_64", POOLED_TITLE)


def sink_over_training(
    histories: Mapping[str, pd.DataFrame], *, title: str | None = None
) -> go.Figure:
    """{model: sink_history table} -> one figure; a message when no model recorded the sink."""
    histories = {name: h for name, h in histories.items() if not h.empty}
    if not histories:
        return message_figure(
            "no sink records: the models' metrics.jsonl (beside each checkpoint) hold none"
        )
    pairs = sorted(
        {(int(r.layer), int(r.visit)) for h in histories.values() for r in h.itertuples()}
    )
    share_col, share_title = share_column(histories)
    titles = [share_title] + [f"layer {layer} · visit {visit}" for layer, visit in pairs]
    n_rows = math.ceil(len(titles) / COLUMNS)
    fig = make_subplots(
        rows=n_rows, cols=COLUMNS, subplot_titles=titles, vertical_spacing=0.35 / n_rows
    )
    for i, (name, h) in enumerate(histories.items()):
        color = model_color(name, i)
        share = h.drop_duplicates("step").sort_values("step")
        panels = [(share, share_col, True)] + [
            (
                h[(h["layer"] == layer) & (h["visit"] == visit)].sort_values("step"),
                "sink_mass",
                False,
            )
            for layer, visit in pairs
        ]
        for p, (part, column, legend) in enumerate(panels):
            fig.add_trace(
                go.Scatter(
                    x=part["step"],
                    y=part[column],
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=legend,
                    line=dict(color=color, width=2),
                    marker=dict(size=5),
                    hovertemplate=f"<b>{name}</b> step %{{x}}<br>%{{y:.3f}}<extra></extra>",
                ),
                row=p // COLUMNS + 1,
                col=p % COLUMNS + 1,
            )
    fig.update_yaxes(rangemode="tozero")
    fig.update_xaxes(title_text="step", row=n_rows)
    return style(fig, title=title, height=220 * n_rows + 80, panels=True)
