"""The case study over training: from each served run's metrics.jsonl (the trainer's case-study
evaluations on held-out recall rows, written while it trains too), every head of every
(layer, visit) as its own line, with uniform attention's BOS level on the run's rows, redrawn
when a run writes a new evaluation."""

from __future__ import annotations

import hashlib

from dash import Output, dcc, html, no_update

from smelt_interp.app import components as ui
from smelt_interp.app import value_kinds as kind
from smelt_interp.app.controls import Control, Controls
from smelt_interp.app.pages.case_study.task import LOAD
from smelt_interp.app.served import Served, metrics_path, provenance_of
from smelt_interp.figures.case_training import over_training_of_logs
from smelt_interp.measure.levels import uniform_bos_share
from smelt_interp.provenance import TASK_RECALL

REFRESH_MS = 5000  # how often the figure looks for new evaluations
CONTROLS = Controls(
    tick=Control("case-tick", "n_intervals", kind.CLICKS),
    seen=Control("case-seen", "data", kind.text(64)),  # the digest the figure was drawn from
)


def layout(served: Served, state: dict) -> html.Section:
    """The case study over training, redrawn when a run writes a new evaluation."""
    return ui.card(
        dcc.Interval(id=CONTROLS.id("tick"), interval=REFRESH_MS, n_intervals=0),
        dcc.Store(id=CONTROLS.id("seen")),
        ui.graph("case-training", loading=False),
        title="Over training",
        subtitle="From each served run's metrics.jsonl (the trainer's case-study evaluation "
        "on held-out recall rows, while it trains too): every head of every (layer, visit) "
        "is its own line (colour: layer; visit 1 of a looped layer dashed; the hover names "
        "the head), so a head that parks on BOS and leaves again would show. First the paper's "
        "quantity, the masses at the answer positions, then BOS mass at the non-answer "
        "positions; dotted, uniform attention's BOS share on rows of the run's length. "
        f"Refreshed every {REFRESH_MS // 1000} s.",
    )


def training_names(served: Served) -> list[str]:
    """Every served run, ready or still training (its metrics exist before its checkpoint)."""
    return list(served.registry.paths)


def training_signature(served: Served) -> str:
    """A digest of each served run's metrics.jsonl (size and modification time): the figure
    is redrawn only when one changed."""
    parts = []
    for name in training_names(served):
        try:
            st = metrics_path(served, name).stat()
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{name}:-")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def uniform_levels(served: Served) -> dict[str, float]:
    """{run: uniform attention's BOS share on its recall rows}, for the loaded runs whose
    training config names their row length."""
    levels = {}
    for name in served.registry.names:
        length = provenance_of(served, name).row_len(TASK_RECALL)
        if length:
            levels[name] = uniform_bos_share(length)
    return levels


def training_figure(served: Served):
    """The figure, built once per change of the runs' logs (figures.case_training keeps it)."""
    logs = {n: metrics_path(served, n) for n in training_names(served)}
    return over_training_of_logs(logs, uniform_levels(served))


def register(app, served: Served) -> None:
    @app.callback(
        Output(ui.gid("case-training"), "figure"),
        CONTROLS["seen"].output(),
        CONTROLS["tick"].input,
        LOAD.input,
        CONTROLS["seen"].state,
    )
    def _training(_, __, seen):
        drawn = training_signature(served)
        if drawn == seen:
            return no_update, no_update
        return training_figure(served), drawn
