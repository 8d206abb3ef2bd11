"""Training curves of runs in progress, overlaid: training loss, held-out loss per domain and
the learning rate by step, one colour per run (Baseline and SMELT in their fixed colours), one
dash per held-out domain. Drawn from metrics.jsonl records (`event` "train" and "eval"; decay
branch records are left out, they would double back over the main run's steps). Used by the
dashboard's Runs page."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from smelt_interp.figures.theme import message_figure, model_color, style

DOMAIN_DASH = ("dash", "dot", "dashdot", "longdash", "longdashdot")
PANELS = ("training loss", "held-out loss per domain", "learning rate")
Records = Sequence[Mapping[str, Any]]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _xy(records: Records, key: str) -> tuple[list, list]:
    """(steps, values) of `key` over the main run's records that hold both as numbers."""
    pairs = [
        (r["step"], r[key])
        for r in records
        if "branch" not in r and _number(r.get("step")) and _number(r.get(key))
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def domains(evals: Records) -> list[str]:
    """The held-out domains the eval records hold a loss for, in first-seen order."""
    seen: dict[str, None] = {}
    for r in evals:
        for key in r:
            if key.startswith("loss/"):
                seen.setdefault(key.partition("/")[2], None)
    return list(seen)


def training_curves(
    runs: Mapping[str, tuple[Records, Records]], *, title: str | None = None
) -> go.Figure:
    """{run name: (train records, eval records)} -> one figure of three panels (PANELS)."""
    runs = {name: pair for name, pair in runs.items() if pair[0] or pair[1]}
    if not runs:
        return message_figure("no metrics yet: the runs have not logged a step")
    fig = make_subplots(rows=1, cols=3, subplot_titles=PANELS, horizontal_spacing=0.07)
    for i, (name, (train, evals)) in enumerate(runs.items()):
        color = model_color(name, i)
        line = dict(color=color, width=2)
        hover = f"<b>{name}</b> step %{{x}}<br>%{{y:.4g}}<extra>%{{fullData.name}}</extra>"
        x, y = _xy(train, "loss")
        fig.add_trace(
            go.Scatter(x=x, y=y, name=name, legendgroup=name, line=line, hovertemplate=hover),
            row=1,
            col=1,
        )
        for d, domain in enumerate(domains(evals)):
            x, y = _xy(evals, f"loss/{domain}")
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="lines+markers",
                    name=f"{name} · {domain}",
                    legendgroup=name,
                    line=dict(color=color, width=2, dash=DOMAIN_DASH[d % len(DOMAIN_DASH)]),
                    marker=dict(size=5),
                    hovertemplate=hover,
                ),
                row=1,
                col=2,
            )
        x, y = _xy(train, "lr")
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                name=f"{name} lr",
                legendgroup=name,
                showlegend=False,
                line=line,
                hovertemplate=hover,
            ),
            row=1,
            col=3,
        )
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(exponentformat="e", col=3)
    style(fig, title=title, height=380, panels=True)
    # a run brings a line per held-out domain: a column on the right, clear of the panel titles
    fig.update_layout(
        legend=dict(orientation="v", x=1.01, xanchor="left", y=1, yanchor="top"),
        margin=dict(r=170),
    )
    return fig
