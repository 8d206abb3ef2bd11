"""What a finished run's metrics log (metrics.jsonl) says beyond its final checkpoint: the
seconds its optimizer steps took, and the sink it held over its last evaluations.

The log is read as an input: a regular file within MAX_LOG_BYTES, opened without blocking; a
torn last line (a run killed mid-write) is skipped, and any other line that is not a JSON
record is a RunFolderError."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from smelt_interp.errors import RunFolderError
from smelt_interp.fields import is_real, shown
from smelt_interp.files import open_input, parse_json
from smelt_interp.measure.sink import best_held
from smelt_interp.provenance import METRICS_FILE
from smelt_interp.train.config import TrainConfig

MAX_LOG_BYTES = 256 << 20  # a metrics log holds ~200 bytes a step: a million steps fit
# The trainer's case-study evaluation of BOS mass at non-answer positions, per layer.visit.head
BOS_NON_ANSWER = "case/bos_non_answer/"


def log_records(run_dir: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of each record of `run_dir`'s metrics log, in order."""
    path = run_dir / METRICS_FILE
    with open_input(path, MAX_LOG_BYTES, RunFolderError, "metrics log") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            rec = _log_record(path, number, line, torn=not line.endswith(b"\n"))
            if rec is not None:
                yield number, rec


def train_seconds(run_dir: Path, cfg: TrainConfig) -> float:
    """Seconds the run spent in optimizer steps, from its metrics log (each train record's
    tokens per step over its tokens/s): the training time, evaluation and saving left out; a
    tokens/s that is not a positive finite number is a RunFolderError."""
    total = 0.0
    for number, rec in log_records(run_dir):
        if rec.get("event") != "train" or "branch" in rec:
            continue
        speed = rec.get("tokens_per_s")
        if speed is None:
            continue
        if not is_real(speed) or speed <= 0:
            raise RunFolderError(
                f"{run_dir / METRICS_FILE}: line {number}: tokens_per_s "
                f"{shown(speed)} is not a positive number"
            )
        total += cfg.tokens_per_step / speed
    return total


def held_sink(run_dir: Path) -> tuple[str, float]:
    """(layer.visit.head, mass) of the head whose BOS mass at non-answer positions held highest
    over the run's last evaluations (measure.sink.held_mass, from the trainer's case-study
    evaluation); ("none", NaN) when the log has too few evaluations or none recorded it."""
    series: dict[str, list[float]] = {}
    for _, rec in log_records(run_dir):
        if rec.get("event") == "eval" and "branch" not in rec:
            for key, value in rec.items():
                if key.startswith(BOS_NON_ANSWER) and is_real(value):
                    series.setdefault(key.removeprefix(BOS_NON_ANSWER), []).append(float(value))
    return best_held(series)


def _log_record(path: Path, number: int, line: bytes, torn: bool) -> dict[str, Any] | None:
    """Line `number` of a metrics log as a record; None for a torn last line (no newline)."""
    try:
        rec = parse_json(line.decode("utf-8"), f"{path}: line {number}", RunFolderError)
    except (UnicodeDecodeError, json.JSONDecodeError):
        rec = None
    if isinstance(rec, dict):
        return rec
    if torn:
        return None
    raise RunFolderError(f"{path}: line {number} is not a JSON record; the log is damaged")
