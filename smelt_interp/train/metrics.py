"""The metrics log, `metrics.jsonl`: one JSON object per line, appended as training runs. A run
killed mid-append leaves a torn last line: readers drop it, and a resumed run rewrites the log
(atomically) without it and without the records past the step it resumes from. The log is read
as an input (a regular file, at most MAX_METRICS_BYTES)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from smelt_interp.errors import CheckpointError
from smelt_interp.files import atomic_write_text, parse_json, read_input_bytes

MAX_METRICS_BYTES = 1 << 30  # a long run's log is a few MiB; a FIFO or /dev/zero never ends


def _parse(line: str) -> dict[str, Any] | None:
    try:  # invalid JSON, nested too deep, a huge integer: not a record
        record = parse_json(line, "a metrics line", CheckpointError)
    except (CheckpointError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) of each record; see read_metrics."""
    raw = read_input_bytes(path, MAX_METRICS_BYTES, CheckpointError, "metrics log")
    lines = raw.decode("utf-8", errors="replace").splitlines()
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = _parse(line)
        if record is None:
            if number == len(lines):
                break  # torn by a kill mid-append
            raise CheckpointError(f"{path}: line {number} is not a JSON record")
        out.append((line, record))
    return out


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The log's records, every line that is not one left out (what a page drawing a run still
    being written shows); read as an input like read_metrics, [] when there is no log."""
    path = Path(path)
    if not path.is_file():
        return []
    raw = read_input_bytes(path, MAX_METRICS_BYTES, CheckpointError, "metrics log")
    lines = raw.decode("utf-8", errors="replace").splitlines()
    return [record for line in lines if line.strip() and (record := _parse(line)) is not None]


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The log's records; a torn last line (a kill mid-append) is dropped, any other line that
    is not a JSON object is a CheckpointError naming it."""
    return [record for _, record in _lines(Path(path))]


def main_evals(records: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """The evaluation records of the main run among parsed records: decay-branch evaluations and
    anything that is not a record are left out."""
    return (
        rec
        for rec in records
        if isinstance(rec, dict) and rec.get("event") == "eval" and "branch" not in rec
    )


def truncate_metrics(path: str | os.PathLike[str], step: int) -> None:
    """Keep the records up to `step` (a resumed run logs the later ones again), each line as it
    was, and drop a torn last line; the log is replaced atomically."""
    path = Path(path)
    if not path.exists():
        return
    kept = [line for line, record in _lines(path) if _step(record) <= step]
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def _step(record: dict[str, Any]) -> float:
    step = record.get("step", 0)
    return step if isinstance(step, (int, float)) and not isinstance(step, bool) else 0
