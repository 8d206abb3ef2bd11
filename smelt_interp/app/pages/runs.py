"""Runs: every watched run folder, finished or still training, refreshed every few seconds.

A table gives each run's state (queued, training, finished, failed with its log's last line,
missing, not a run), step of steps, tokens seen, tokens/s and ETA; below it the runs' curves
overlaid (training loss, held-out loss per domain, learning rate) and the trainer's attention
sink per (layer, visit) with Sink^0.3. Each refresh reads only the lines the trainers appended
since the last one (app.pages.run_watch), and redraws the figures only when some run logged
something new. The folders are set by `watch` (the app's command does it) before the
app is created; one process serves one app. A served transformers model folder is not a run (it
has no training log): a note under the title says so, in place of the empty page's message."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from dash import Output, dcc, html, no_update

from smelt_interp.app import components as ui
from smelt_interp.app import urls
from smelt_interp.app import value_kinds as kind
from smelt_interp.app.controls import Control, Controls
from smelt_interp.app.figure_cache import plain
from smelt_interp.app.lru import LRU
from smelt_interp.app.pages.run_watch import RunsWatcher, RunView
from smelt_interp.app.served import Served
from smelt_interp.figures.runs import training_curves
from smelt_interp.figures.sink_training import sink_over_training
from smelt_interp.machine import clock_duration
from smelt_interp.train.progress import LOG_FILE, METRICS_FILE, contained
from smelt_interp.train.sink_eval import sink_table

PATH = "/runs"
TITLE = "Runs"
PROBES: tuple[str, ...] = ()  # draws no probe
USES_MODELS = False  # drawn from the run folders: laid out the same while models are pending
REFRESH_MS = 3000
TICK, SEEN, TABLE, MESSAGE = "runs-tick", "runs-seen", "runs-table", "runs-msg"
# the page's controls, declared once (no URL keys: the page has no state to share)
CONTROLS = Controls(
    tick=Control(TICK, "n_intervals", kind.CLICKS),
    seen=Control(SEEN, "data", kind.text(64)),  # the digest of what the figures show
)
QUERY: urls.Query = CONTROLS.query
INPUTS = CONTROLS.kinds
COLUMNS = ("Run", "State", "Step", "Tokens", "Tokens/s", "ETA", "Note")

WATCHER = RunsWatcher()


def watch(run_dirs: Iterable[Path], root: Path | None = Path("runs")) -> None:
    """The folders this page shows: `run_dirs`, and the run folders found under `root`."""
    WATCHER.watch(run_dirs, root)


def _count(n: int | None) -> str:
    if n is None:
        return "–"
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _note(view: RunView) -> str:
    p, tail = view.progress, view.tail
    notes = [p.message] if p.message else []
    for name in (METRICS_FILE, LOG_FILE):
        if (p.run_dir / name).is_symlink() and contained(p.run_dir, name) is None:
            notes.append(f"{name} is a link out of the run folder; it is not read")
    if tail.skipped:
        notes.append(
            f"{tail.path.name} is long: its first {tail.skipped / 2**20:,.0f} MiB are not read"
        )
    if tail.bad_lines:
        notes.append(f"{tail.bad_lines} line(s) of {tail.path.name} are not JSON and are skipped")
    if tail.torn and p.state != "training":
        notes.append(f"the last line of {tail.path.name} is torn (cut mid-write); it is left out")
    return "; ".join(notes)


def _row(view: RunView) -> html.Tr:
    p = view.progress
    step = "–" if p.step is None else f"{p.step:,}"
    if p.steps:
        step += f" of {p.steps:,}"
    cells = [
        html.Td(view.name, className="run-name", title=str(p.run_dir)),
        html.Td(html.Span(p.state.replace("_", " "), className=f"run-state state-{p.state}")),
        html.Td(step, className="run-step"),
        html.Td(_count(p.tokens_seen)),
        html.Td("–" if p.tokens_per_s is None else f"{p.tokens_per_s:,.0f}"),
        html.Td(clock_duration(p.eta_s) if p.eta_s is not None and p.state == "training" else "–"),
        html.Td(_note(view), className="run-note"),
    ]
    return html.Tr(cells, className=f"run-row row-{p.state}")


def table(views: list[RunView]) -> html.Table:
    return html.Table(
        [html.Thead(html.Tr([html.Th(c) for c in COLUMNS])), html.Tbody([_row(v) for v in views])],
        className="table runs-table",
    )


def signature(views: list[RunView]) -> str:
    """What the figures were drawn from, as "<curves digest>:<sink digest>": each run's log
    generation and lines read for the curves, its eval records seen for the sink (which
    changes only at an evaluation, so most refreshes leave it alone)."""

    def digest(parts: Iterable[str]) -> str:
        return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]

    curves = digest(f"{v.name}:{v.tail.generation}:{v.tail.lines}" for v in views)
    sink = digest(f"{v.name}:{v.tail.generation}:{v.tail.count('eval')}" for v in views)
    return f"{curves}:{sink}"


def curves_figure(views: list[RunView]):
    return training_curves(
        {v.name: (v.tail.records("train"), v.tail.records("eval")) for v in views}
    )


def sink_figure(views: list[RunView]):
    return sink_over_training({v.name: sink_table(v.tail.records("eval")) for v in views})


def model_folders(served: Served) -> list[str]:
    """The served models that are transformers model folders, not runs of the trainer."""
    return [name for name, path in served.registry.paths.items() if path.is_dir()]


def folders_note(names: list[str]) -> str | None:
    """Why the served model folders `names` have no row here, or None when there are none."""
    if not names:
        return None
    plural = "s" if len(names) > 1 else ""
    return (
        f"{ui.subject(names, 'is a', 'are')} transformers model folder{plural}, not a run of "
        "this project's trainer: no training log to show here."
    )


def empty_message(views: list[RunView], folders: list[str] | None = None) -> str | None:
    """The page's message when it has no run to show (None where the served model folders'
    note already says why)."""
    if views or folders:
        return None
    root = WATCHER.root
    where = f" under {root}" if root is not None else ""
    return (
        f"No run folders{where} yet. Train one with `python -m smelt_interp.train --out "
        f"runs/NAME`, or start `make demo`, and it appears here."
    )


def layout(served: Served, state: dict) -> html.Div:
    return html.Div(
        [
            ui.page_head(
                "Runs",
                "Every run folder the dashboard was given or found under its runs folder, "
                "finished or still training, read live from each run's metrics.jsonl. It "
                f"refreshes every {REFRESH_MS // 1000} s, reading only the lines added since.",
            ),
            *(
                [html.P(folders_note(model_folders(served)), className="note runs-folders")]
                if model_folders(served)
                else []
            ),
            dcc.Interval(id=TICK, interval=REFRESH_MS, n_intervals=0),
            dcc.Store(id=SEEN),
            ui.message(MESSAGE),
            ui.card(html.Div(id=TABLE), title="Progress"),
            ui.card(
                ui.graph("runs-curves", loading=False),
                title="Loss and learning rate",
                subtitle="Every run on one axis per panel (Baseline blue, SMELT orange); "
                "held-out losses are the periodic evaluations, one dash per domain. Click a "
                "legend entry to hide a run.",
            ),
            ui.card(
                ui.graph("runs-sink", loading=False),
                title="Attention sink during training",
                subtitle="Sink^0.3 (Gu et al.'s, per sample; the pooled figure for logs older than "
                "it) and the mean BOS mass per (layer, visit) at each periodic "
                "evaluation, one line per run.",
            ),
        ]
    )


def register(app, served: Served) -> None:
    # Figures per signature: every tab opened on the same runs' records gets the one drawing.
    drawn_figures = LRU(maxsize=16)

    def drawing(kind: str, digest: str, draw) -> dict:
        return drawn_figures.get_or_compute((kind, digest), lambda: plain(draw()))

    @app.callback(
        Output(TABLE, "children"),
        Output(MESSAGE, "children"),
        Output(MESSAGE, "style"),
        Output(ui.gid("runs-curves"), "figure"),
        Output(ui.gid("runs-sink"), "figure"),
        Output(SEEN, "data"),
        *CONTROLS.inputs("tick"),
        *CONTROLS.states("seen"),
    )
    def _refresh(_, seen):
        views = WATCHER.poll()
        text, style = ui.show_message(empty_message(views, model_folders(served)))
        drawn = signature(views)
        old_curves, _, old_sink = (seen or "").partition(":")
        new_curves, _, new_sink = drawn.partition(":")
        if new_curves == old_curves:
            curves = no_update
        else:
            curves = drawing("curves", new_curves, lambda: curves_figure(views))
        if new_sink == old_sink:
            sink = no_update
        else:
            sink = drawing("sink", new_sink, lambda: sink_figure(views))
        return table(views), text, style, curves, sink, drawn
