"""The contract between a probe module and the commands that run it (its own CLI and the
report): a name, a `run` that turns a model and the shared inputs into named tidy tables, and a
`summarize` that condenses those tables into a few headline statistics with the paper's values."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes.attention_stats import DEFAULT_CHUNK
from smelt_interp.probes.common import DEFAULT_BATCH
from smelt_interp.probes.inputs import ProbeInputs

Tables = dict[str, pd.DataFrame]
SUMMARY_COLUMNS = ("statistic", "value", "paper")


@dataclass(frozen=True)
class ProbeOptions:
    """Knobs shared by the probes: rows per forward pass, queries per attention chunk, the
    sink threshold and the k of top-k attended-key overlap."""

    batch_size: int = DEFAULT_BATCH
    chunk: int = DEFAULT_CHUNK
    threshold: float = 0.3
    top: int = 8


@dataclass(frozen=True)
class ProbeSpec:
    """One probe as the commands see it. The first table of `run` is the main one."""

    name: str
    description: str
    run: Callable[[SmeltModel, ProbeInputs, ProbeOptions], Tables]
    summarize: Callable[[Tables], pd.DataFrame]


def summary(rows: list[tuple[str, float, str]]) -> pd.DataFrame:
    """A summary table from (statistic, value, paper) triples; paper is '' where it gives none."""
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
