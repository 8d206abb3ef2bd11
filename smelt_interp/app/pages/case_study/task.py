"""The case study's task: which of the two tasks the page shows (the chooser's control, and the
default when the URL names none), and the trigger every view that draws on arrival reads."""

from __future__ import annotations

from smelt_interp.app import value_kinds as kind
from smelt_interp.app.compute import Workbench
from smelt_interp.app.controls import Control

TASKS = {"assoc_recall": "Associative recall", "dyck": "Dyck"}
TASK = Control("case-task", "value", kind.choice(*TASKS), url=str)
LOAD = Control("case-load", "data", kind.ANY)  # a trigger: the page has appeared


def default_task(wb: Workbench) -> str:
    """assoc_recall when a served model trained on it (weight > 0), else dyck: the probe's
    default too."""
    for name in wb.registry.names:
        data = (wb.registry.info(name).train_config or {}).get("data")
        if isinstance(data, dict) and (data.get("assoc_recall") or 0) > 0:
            return "assoc_recall"
    return "dyck"


def task_of(wb: Workbench, value) -> str:
    return value if value in TASKS else default_task(wb)
