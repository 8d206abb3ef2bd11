"""The case study over training drawn from runs' logs, built once per change of those logs.

Reading every run's metrics.jsonl into the long table and drawing a subplot grid with a line per
head takes a second or more; the dashboard asks for it on every page load of every user. The
figure depends only on the logs and the uniform levels, so it is kept under a key of each log's
path, size and modification time (and the levels): a request with unchanged logs gets the kept
figure, one after a run appended an evaluation builds it again. Concurrent requests for one key
wait for one build rather than each making their own."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from smelt_interp.figures.case_study import over_training
from smelt_interp.train.case_eval import case_history

KEPT = 8  # figures kept (one per set of served runs; a dashboard serves one)
_kept: OrderedDict[tuple, dict[str, Any]] = OrderedDict()
_lock = threading.Lock()  # guards _kept and serialises builds (all requests want one figure)
builds = 0  # how many figures were built (not served from _kept): what the tests count


def log_stamp(path: Path | None) -> tuple[str, int, int] | tuple[str]:
    """(path, size, modification time in ns) of a log, or (path,) where there is none."""
    if path is None:
        return ("",)
    try:
        st = Path(path).stat()
    except OSError:
        return (str(path),)
    return (str(path), st.st_size, st.st_mtime_ns)


def logs_key(logs: Mapping[str, Path | None], uniform: Mapping[str, float]) -> tuple:
    """What the figure depends on: each run's name and log stamp, and the uniform levels."""
    return (
        tuple((name, log_stamp(path)) for name, path in logs.items()),
        tuple(sorted(uniform.items())),
    )


def over_training_of_logs(
    logs: Mapping[str, Path | None], uniform: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """figures.case_study.over_training of the runs' logs ({run: its metrics.jsonl, None for
    a run with none}), as a plotly figure dict, built only when a log changed since the last
    build for these runs. The dict is shared between callers: read it, do not change it."""
    global builds
    uniform = dict(uniform or {})
    key = logs_key(logs, uniform)
    with _lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
        tables = {name: case_history(path) for name, path in logs.items() if path is not None}
        figure = over_training(tables, uniform=uniform).to_plotly_json()
        builds += 1
        _kept[key] = figure
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
        return figure
