"""Case study: where the answer positions look, visit by visit, on two tasks the page switches
between: in-context associative recall (data.assoc_recall) and in-context Dyck, the paper's own
case study. Under the task chooser, the served models trained on each task.

The page composes four views, each a module with its layout fragment (`layout(served, state)`), its
controls (`CONTROLS`: its URL keys among them) and its callbacks (`register(app, served)`):

    aggregate       the `case_study` probe's per-visit aggregate for the chosen task, led by the
                    paper's quantity (answer-position masses as head means, the best head and
                    uniform attention's levels beside them), beside the paper's Dyck values
                    (smelt_interp.paper.DYCK), every served model measured on the task's rows
    over_training   the trainer's case-study evaluations over training, every head its own
                    line, refreshed while a run writes them
    recall          one held-out recall row and one head's attention from an answer position
    dyck            a Dyck prompt to build or type, both models' completions and their masses

The page itself owns the task chooser (task.py: which task, and its default), shows the
chosen task's example and hides the other, and writes the views' keys into the URL. /dyck
(the page's old address) redirects here."""

from __future__ import annotations

from dash import Output, dcc, html

from smelt_interp.app import components as ui
from smelt_interp.app import urls
from smelt_interp.app.controls import Controls
from smelt_interp.app.pages.case_study import aggregate, dyck, over_training, recall
from smelt_interp.app.pages.case_study.task import (
    LOAD,
    TASK,
    TASKS,
    ids_only_note,
    models_by_task,
    task_of,
)
from smelt_interp.app.served import Served, text_models

PATH = "/case-study"
TITLE = "Case study"
REDIRECT_FROM = ("/dyck",)  # the page's address before it covered both tasks
PROBES = (aggregate.PROBE,)  # the registered probes whose tables this page draws
VIEWS = (aggregate, over_training, recall, dyck)
# the page's controls: the task's, then each view's (the URL keys in URL order)
CONTROLS = Controls(task=TASK, **{n: c for v in VIEWS for n, c in v.CONTROLS.items()}, load=LOAD)
QUERY: urls.Query = CONTROLS.query
INPUTS = CONTROLS.kinds
SHOWN, HIDDEN = {"display": "block"}, {"display": "none"}
EXAMPLES = {"assoc_recall": "case-recall", "dyck": "case-dyck"}  # each task's example, by id
# The URL keys in two writers, so that no callback request outgrows the request body cap
# (http_hardening.MAX_REQUEST_BYTES) whatever its values: the Dyck prompt's apart from the
# rest. Not one writer per view: writers that fire together each merge into the same old
# query string, and the last answer would drop the others' keys.
URL_GROUPS = (
    ("task", *aggregate.CONTROLS.query, *recall.CONTROLS.query),
    tuple(dyck.CONTROLS.query),
)


def shown(task: str, example: str) -> dict:
    """The style of `example`'s section (a key of EXAMPLES) while `task` is chosen."""
    return SHOWN if example == task else HIDDEN


def task_models(served: Served) -> html.Ul:
    """Under the chooser, each task with the served models trained on it."""
    found = models_by_task(served)
    text = set(text_models(served))
    items = [
        html.Li(
            [
                html.B(f"{TASKS[task]}, trained on it: "),
                ", ".join(n for n in found[task] if n in text) or "none",
            ]
        )
        for task in TASKS
    ]
    note = ids_only_note(served)
    if note:
        items.append(html.Li(note, className="case-ids-only"))
    return html.Ul(items, id="case-task-models", className="case-task-models")


def layout(served: Served, state: dict) -> html.Div:
    task = task_of(served, state.get("task"))
    return html.Div(
        [
            ui.page_head(
                "Case study",
                "Where the positions that predict an answer look, visit by visit. In the "
                "paper's Dyck study, the answer positions of SMELT's first visit put 0.60 of "
                "their attention on BOS and its second visit 0.02, moving to the "
                "demonstrations' answers (0.24 -> 0.85), as means over heads. This page "
                "measures the same quantity on the served models, on in-context Dyck and on "
                "associative recall, a task where the answer can be read from the tokens after "
                "the trigger's earlier occurrences; whether a sink forms on it is what the "
                "figures show, not something assumed.",
            ),
            ui.card(
                ui.radio(TASK.id, list(TASKS), task, list(TASKS.values())),
                task_models(served),
                title="Task",
                class_name="case-task",
            ),
            dcc.Store(id=LOAD.id, data=0),
            aggregate.layout(served, state),
            over_training.layout(served, state),
            *(
                html.Div(view.layout(served, state), id=EXAMPLES[name], style=shown(task, name))
                for name, view in (("assoc_recall", recall), ("dyck", dyck))
            ),
        ]
    )


def register(app, served: Served) -> None:
    @app.callback(*(Output(section, "style") for section in EXAMPLES.values()), TASK.input)
    def _show(task):
        task = task_of(served, task)
        return tuple(shown(task, example) for example in EXAMPLES)

    for view in VIEWS:
        view.register(app, served)
    sources = CONTROLS.url_sources()
    for keys in URL_GROUPS:
        urls.write_to_url(app, QUERY, {key: sources[key] for key in keys})
