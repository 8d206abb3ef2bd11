"""The case study's accuracy at the answer positions, each rate pooled over rows or prompts
with a 95% percentile bootstrap interval (measure.intervals): next-token argmax accuracy for
associative recall (from the RowMasses of its rows), exact match under greedy generation and
teacher-forced accuracy for in-context Dyck prompts; and greedy accuracy on computed-class
recall rows at their query and answer positions (the trainer's periodic evaluation)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.computed_recall import ComputedRecallSpec, computed_positions
from smelt_interp.data.dyck import DyckExample, dyck_batch
from smelt_interp.measure.batching import DEFAULT_BATCH, inference, make_batch, micro_batches
from smelt_interp.measure.dyck_score import answer_scores, complete_many, stop_ids
from smelt_interp.measure.group_masses import RowMasses, by_demos
from smelt_interp.measure.intervals import LEVEL, N_RESAMPLES, interval, pooled, resample_weights
from smelt_interp.model.protocol import LoopedModel

ACCURACY_COLUMNS = ("task", "n_demos", "n", "accuracy", "lo", "hi", "kind")


def rate_row(
    n_demos: int, hits: np.ndarray, counts: np.ndarray, kind: str, seed: int, level: float
) -> dict:
    """One accuracy row: hits / counts pooled over rows, with its bootstrap interval."""
    weights = resample_weights(len(counts), N_RESAMPLES, seed)
    point, boot = pooled(hits[:, None], counts, weights)
    lo, hi = interval(boot, level)
    return {
        "n_demos": n_demos,
        "n": int(counts.sum()),
        "accuracy": float(point[0]),
        "lo": float(lo[0]),
        "hi": float(hi[0]),
        "kind": kind,
    }


def recall_accuracy(masses: RowMasses, *, seed: int = 0, level: float = LEVEL) -> pd.DataFrame:
    """Next-token argmax accuracy at the answer positions per n_demos (0: first occurrences);
    n counts positions."""
    rows = []
    for g in range(masses.counts.shape[1] - 1):
        keep = masses.counts[:, g] > 0
        if keep.any():
            hits, counts = masses.hits[keep, g], masses.counts[keep, g]
            rows.append(rate_row(g, hits, counts, "next_token", seed + g, level))
    return pd.DataFrame(rows, columns=ACCURACY_COLUMNS[1:])


def dyck_accuracy(
    model: LoopedModel,
    examples: Sequence[DyckExample],
    *,
    batch_size: int = DEFAULT_BATCH,
    seed: int = 0,
    level: float = LEVEL,
    tokenizer: Tokenizer | None = None,
) -> pd.DataFrame:
    """Per demonstration count, kind `exact_match` (greedy generation: the answer and nothing
    more) and `teacher_forced` (argmax right at every answer token, then a stop); n counts
    prompts. The examples are in `tokenizer`'s tokens (default bytes)."""
    stops = stop_ids(tokenizer)
    rows = []
    for n_demos, group in by_demos(examples).items():
        tokens, _ = dyck_batch(group)
        batch = make_batch(model, tokens, torch.tensor([len(ex.ids) for ex in group]))
        forced = []
        for mb in micro_batches(batch, batch_size, "case study accuracy"):
            with inference(model):
                logits = model(mb.tokens)
            spans = [ex.answer_span for ex in group[mb.rows]]
            forced += answer_scores(logits, mb.tokens, spans, stops)[1].tolist()
        answers = complete_many(model, group, batch_size=max(batch_size, 32), tokenizer=tokenizer)
        greedy = [a == ex.answer for a, ex in zip(answers, group)]
        ones = np.ones(len(group))
        for kind, hits in (("exact_match", greedy), ("teacher_forced", forced)):
            rows.append(rate_row(n_demos, np.array(hits, float), ones, kind, seed + n_demos, level))
    return pd.DataFrame(rows, columns=ACCURACY_COLUMNS[1:])


def computed_accuracy(
    model: LoopedModel,
    rows: torch.Tensor,
    spec: ComputedRecallSpec,
    *,
    batch_size: int = DEFAULT_BATCH,
) -> dict[str, float]:
    """Greedy (argmax) next-token accuracy on computed-recall rows [n, T] of `spec`:
    `query_accuracy` at each row's query position (its last `=`, which predicts the query's
    label) and `answer_accuracy` pooled over every answer position (an `=` whose class an earlier
    demonstration shows), with `n_query` and `n_answer` the positions counted. An accuracy with
    no position to count is NaN."""
    positions = computed_positions(rows.cpu(), spec)
    batch = make_batch(model, rows)
    right = torch.zeros(rows.shape, dtype=torch.bool)
    for mb in micro_batches(batch, batch_size, "computed-recall accuracy"):
        with inference(model):
            predicted = model(mb.tokens).argmax(dim=-1).cpu()
        t = predicted.shape[1]
        right[mb.rows, :t] = predicted == positions.targets[mb.rows, :t]
    out: dict[str, float] = {}
    for name, where in (("query", positions.query), ("answer", positions.answer)):
        n = int(where.sum())
        out[f"{name}_accuracy"] = float(right[where].double().mean()) if n else float("nan")
        out[f"n_{name}"] = n
    return out
