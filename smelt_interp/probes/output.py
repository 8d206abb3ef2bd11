"""Writing and printing probe results: tables of several models stacked with a `model` column,
summaries side by side, atomic CSV/JSON files (a temp file renamed into place, so a failure
never leaves a half-written or clobbered file) and plain-text tables for the terminal."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from smelt_interp.atomic import atomic_write_text
from smelt_interp.probes.spec import Tables


def stack_models(per_model: Mapping[str, Tables]) -> Tables:
    """{model: {table: df}} -> {table: df with a leading `model` column}, tables in first-seen order."""
    names: list[str] = []
    for tables in per_model.values():
        names += [n for n in tables if n not in names]
    out: Tables = {}
    for name in names:
        parts = [
            df.assign(model=label)[["model", *df.columns]]
            for label, tables in per_model.items()
            if (df := tables.get(name)) is not None
        ]
        out[name] = pd.concat(parts, ignore_index=True)
    return out


def side_by_side(summaries: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """{model: summary} -> one row per statistic (first-seen order), one column per model, then `paper`."""
    order: list[str] = []
    paper: dict[str, str] = {}
    values: dict[str, dict[str, float]] = {}
    for label, df in summaries.items():
        for stat, value, ref in zip(df["statistic"], df["value"], df["paper"]):
            if stat not in order:
                order.append(stat)
            paper[stat] = paper.get(stat) or ref
            values.setdefault(label, {})[stat] = value
    out = pd.DataFrame({"statistic": order})
    for label in summaries:
        out[label] = [values.get(label, {}).get(stat, float("nan")) for stat in order]
    out["paper"] = [paper[stat] for stat in order]
    return out


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON-ready rows: numpy scalars to Python, NaN and inf to null."""
    return json.loads(df.to_json(orient="records", double_precision=10))


def csv_paths(path: str | os.PathLike[str], names: list[str]) -> dict[str, Path]:
    """The main table goes to `path`; each further table to `<stem>.<name><suffix>` beside it."""
    path = Path(path)
    suffix = path.suffix or ".csv"
    return {
        name: path if i == 0 else path.with_name(f"{path.stem}.{name}{suffix}")
        for i, name in enumerate(names)
    }


def write_csv(path: str | os.PathLike[str], tables: Tables) -> list[Path]:
    return [
        atomic_write_text(p, tables[name].to_csv(index=False))
        for name, p in csv_paths(path, list(tables)).items()
    ]


def format_table(df: pd.DataFrame, max_rows: int = 60) -> str:
    """A readable fixed-width table (4 significant decimals, long tables cut in the middle)."""
    if df.empty:
        return "(empty)"
    return df.to_string(index=False, max_rows=max_rows, float_format=lambda v: f"{v:.4f}")
