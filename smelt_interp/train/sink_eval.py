"""The attention sink during training: what the periodic evaluation records, from a short batch of
held-out rows, with the statistic the sink probe uses (smelt_interp.measure.sink)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.measure.sink import sink_record
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.train.metrics import main_evals, read_records

SINK_ROWS = 8  # held-out rows per evaluation: enough for a per-head mean, cheap on a CPU


def heldout_sink(model: SmeltModel, rows: torch.Tensor) -> dict[str, float]:
    """{"sink_mass/{layer}.{visit}": mean BOS mass over heads at the rows' length,
    "sink03_gu": Sink^0.3 as Gu et al. compute it, "sink03_64": the pooled figure, both on
    64-token windows} from the first SINK_ROWS of `rows` (padding
    excluded)."""
    rows = rows[:SINK_ROWS]
    return sink_record(model, rows, rows != PAD_ID)


HISTORY_COLUMNS = ("step", "layer", "visit", "sink_mass", "sink03_gu", "sink03_64")


def _layer_visit(key: str) -> tuple[int, int] | None:
    """(layer, visit) of a "sink_mass/{layer}.{visit}" key; None for any other key."""
    prefix, _, where = key.partition("/")
    layer, _, visit = where.partition(".")
    if prefix != "sink_mass" or not (layer.isdigit() and visit.isdigit()):
        return None
    return int(layer), int(visit)


def sink_history(metrics_path: str | Path) -> pd.DataFrame:
    """The sink over training from a run's metrics.jsonl: one row per (eval step, layer, visit)
    with columns HISTORY_COLUMNS (sink03_gu and sink03_64 repeated over the step's rows;
    sink03_gu empty in logs written before the trainer recorded it). Decay-branch
    evaluations and lines that are not JSON (a run still writing) are left out; a missing file
    or one without sink records gives an empty table."""
    return sink_table(read_records(metrics_path))


def sink_table(records: Iterable[Any]) -> pd.DataFrame:
    """sink_history's table from already parsed metrics records (anything not an eval record
    of the main run is left out)."""
    rows: list[dict] = []
    for rec in main_evals(records):
        for key, value in rec.items():
            where = _layer_visit(key)
            if where is not None and isinstance(value, (int, float)):
                rows.append(
                    {
                        "step": rec.get("step"),
                        "layer": where[0],
                        "visit": where[1],
                        "sink_mass": value,
                        "sink03_gu": rec.get("sink03_gu"),
                        "sink03_64": rec.get("sink03_64"),
                    }
                )
    return pd.DataFrame(rows, columns=list(HISTORY_COLUMNS))
