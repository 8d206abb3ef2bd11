"""The case study's task: which of the two tasks the page shows (the chooser's control, and the
default when the URL names none), the served models trained on each, and the trigger every view
that draws on arrival reads."""

from __future__ import annotations

from smelt_interp.app import value_kinds as kind
from smelt_interp.app.components import subject
from smelt_interp.app.controls import Control
from smelt_interp.app.served import Served, provenance_of, text_models
from smelt_interp.provenance import TASK_DYCK, TASK_RECALL

TASKS = {"assoc_recall": "Associative recall", "dyck": "Dyck"}
TASK = Control("case-task", "value", kind.choice(*TASKS), url=str)
LOAD = Control("case-load", "data", kind.ANY)  # a trigger: the page has appeared


def ids_only_note(served: Served) -> str | None:
    """Why some served models are left out of the case study (their folders hold no
    tokenizer: its prompts are text), or None when every served model reads text."""
    left = [n for n in served.registry.names if n not in text_models(served)]
    if not left:
        return None
    return (
        f"{subject(left, 'has', 'have')} no tokenizer in its model folder, so no Dyck or recall "
        "prompt (text) is posed to it here; its attention on a row of token ids is on the "
        "Attention page."
    )


def default_task(served: Served) -> str:
    """assoc_recall when a served model trained on it, else dyck: the probe's default too."""
    tasks = {provenance_of(served, name).task for name in served.registry.names}
    return TASK_RECALL if TASK_RECALL in tasks else TASK_DYCK


def task_of(served: Served, value) -> str:
    return value if value in TASKS else default_task(served)


def models_by_task(served: Served) -> dict[str, list[str]]:
    """{task: the served models trained on it}, every task of TASKS (an empty list for one no
    served model trained on)."""
    found: dict[str, list[str]] = {task: [] for task in TASKS}
    for name in served.registry.names:
        task = provenance_of(served, name).task
        found.setdefault(task, []).append(name)
    return found
