"""Pages of runs that are not ready. A served name whose checkpoint has not appeared yet (a run
still training or queued) is pending (ModelRegistry.pending): every page shows its run's
progress (state, step of steps, tokens/s, ETA, or why it stopped) instead of an error, above
the page when other models are ready, in its place when none is. The card polls every
POLL_MS; when the set of ready models changes (a checkpoint appeared) the page reloads itself
and fills in, with no server restart."""

from __future__ import annotations

from types import ModuleType

from dash import Dash, Output, dcc, html, no_update

from smelt_interp.app import components as ui
from smelt_interp.app import value_kinds as kind
from smelt_interp.app.controls import Control, Controls
from smelt_interp.app.served import Served
from smelt_interp.machine import clock_duration
from smelt_interp.train.progress import RunProgress

POLL_MS = 2000
BODY = "pending-body"  # the progress rows, redrawn by each poll
RELOAD = "pending-reload"  # set when the ready models changed; the browser then reloads
RELOADED = "pending-reloaded"  # the reload callback's (unused) output
CONTROLS = Controls(
    poll=Control("pending-poll", "n_intervals", kind.CLICKS),
    served=Control("pending-served", "data", kind.ANY),  # the ready models the page drew
    reload=Control(RELOAD, "data", kind.ANY),
)
INPUTS = CONTROLS.kinds
STATE_BADGE = {"training": "warn", "queued": "warn", "finished": "ok"}  # else "bad"

RELOAD_JS = """
function(reload) {
    if (reload) { window.location.reload(); }
    return window.dash_clientside.no_update;
}
"""


def progress_text(p: RunProgress) -> str:
    """'step 120 of 600 (20%) · 48,000 tokens · 3,400 tokens/s · ETA 2 min 10 s', the parts
    the run has."""
    parts = []
    if p.step is not None:
        of = f" of {p.steps:,} ({p.step / p.steps:.0%})" if p.steps else ""
        parts.append(f"step {p.step:,}{of}")
    elif p.state in ("training", "queued"):
        parts.append("no step logged yet")
    if p.tokens_seen is not None:
        parts.append(f"{p.tokens_seen:,} tokens")
    if p.tokens_per_s:
        parts.append(f"{p.tokens_per_s:,.0f} tokens/s")
    if p.eta_s is not None:
        parts.append(f"ETA {clock_duration(p.eta_s)}")
    return " · ".join(parts)


def progress_row(name: str, p: RunProgress) -> html.Div:
    bar = (
        [html.Progress(value=str(p.step), max=str(p.steps), className="run-progress")]
        if p.step is not None and p.steps
        else []
    )
    return html.Div(
        [
            html.B(name),
            " ",
            html.Span(p.state, className=f"badge {STATE_BADGE.get(p.state, 'bad')}"),
            " ",
            html.Span(progress_text(p), className="pending-progress"),
            *bar,
            html.Div(p.message, className="note") if p.message else None,
        ],
        className="pending-run",
    )


def rows(waiting: list[tuple[str, RunProgress]]) -> list[html.Div]:
    return [progress_row(name, p) for name, p in waiting]


def card(served: Served, waiting: list[tuple[str, RunProgress]]) -> html.Section:
    ready = served.registry.names
    return ui.card(
        html.Div(rows(waiting), id=BODY),
        dcc.Interval(id=CONTROLS.id("poll"), interval=POLL_MS),
        dcc.Store(id=CONTROLS.id("served"), data=ready),
        dcc.Store(id=RELOAD, data=False),
        dcc.Store(id=RELOADED),
        title="Still training" if ready else "Waiting for the first checkpoint",
        subtitle="This page fills in by itself when a run's checkpoint is written"
        + (f"; it shows {', '.join(ready)} meanwhile." if ready else "."),
        class_name="pending",
    )


def layout(page: ModuleType, served: Served, state: dict) -> html.Div:
    """`page` for the URL state, with the pending runs' progress above it; only the progress
    (under the page's title) while no model is ready. A page that draws no model (its
    USES_MODELS is False) is laid out as it is."""
    waiting = served.registry.pending() if getattr(page, "USES_MODELS", True) else []
    if not waiting:
        return page.layout(served, state)
    if not served.registry.names:
        return html.Div(
            [
                ui.page_head(
                    page.TITLE,
                    "No checkpoint of the served runs exists yet: their progress is below.",
                ),
                card(served, waiting),
            ]
        )
    return html.Div([card(served, waiting), page.layout(served, state)])


def register(app: Dash, served: Served) -> None:
    @app.callback(
        Output(BODY, "children"),
        Output(RELOAD, "data"),
        *CONTROLS.inputs("poll"),
        *CONTROLS.states("served"),
    )
    def _poll(_, drawn):
        if served.registry.names != drawn:
            return no_update, True
        return rows(served.registry.pending()), no_update

    app.clientside_callback(RELOAD_JS, Output(RELOADED, "data"), *CONTROLS.inputs("reload"))
