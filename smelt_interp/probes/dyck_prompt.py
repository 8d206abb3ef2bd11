"""One model on one in-context Dyck prompt: its greedy completion, whether it is the answer,
and the case study's masses of that one example (per head, and per visit as the case study
pools them). The dashboard's Dyck view draws this; the model is opened by the caller."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.dyck import DyckExample
from smelt_interp.errors import DataError, PromptError, TokenizerError
from smelt_interp.measure.case_heads import by_visit
from smelt_interp.measure.case_tables import dyck_heads
from smelt_interp.measure.dyck_score import complete
from smelt_interp.model.protocol import LoopedModel


@dataclass(frozen=True)
class DyckCase:
    """One model on one in-context Dyck prompt."""

    model: str
    example: DyckExample
    completion: str
    correct: bool
    visits: pd.DataFrame  # measure.case_heads.by_visit of this one example
    heads: pd.DataFrame | None = None  # its per-head rows (measure.case_tables.dyck_heads)


def run_dyck_prompt(
    model: LoopedModel, name: str, ex: DyckExample, tokenizer: Tokenizer
) -> DyckCase:
    """`model` (called `name`) completing `ex` greedily, and the case study's masses of `ex`;
    PromptError where the completion cannot be read in `tokenizer`."""
    try:
        answer = complete(model, ex.query, demos=ex.demos, tokenizer=tokenizer)
    except (DataError, TokenizerError) as exc:
        raise PromptError(str(exc)) from None
    measured = dyck_heads(model, [ex])
    return DyckCase(name, ex, answer, answer == ex.answer, by_visit(measured), measured)
