"""The tracked head of a model on computed-class recall rows (data.computed_recall): the head h
of a looped layer L whose ablation at visit 1 only (`attn.hook_z` of (L, 1), head h) drops
greedy accuracy at the rows' answer positions the most. It is chosen on validation rows alone,
so the masses a probe then reports of it on test rows are not selected on the same rows.

The ablation is a MEAN ablation: head h's z at visit 1 is replaced, at every position, by the
mean of its z at VISIT 0 of the same layer over the validation rows' valid positions (PAD left
out). The mean keeps the head's output at its average, in the range the layer produces, where
zero may be a value the head never writes: the drop then measures what the head reads from each
row, not the shock of an input the later layers never saw. Taking the mean from visit 0 keeps
visit 1's own reading out of what replaces it. A model that visits each layer once (a Baseline)
has no visit 1: every head of every layer is then ablated at its only visit by its mean there,
and HeadChoice.note says so. Ties in the drop go to the first head in (layer, head) order; where
no ablation lowers accuracy at all (an untrained model) the note says the choice is empty.

The edit is a forward hook on the hook point (run_with_hooks), so it applies to any model of
the protocol (SmeltModel and the transformers adapters alike)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch

from smelt_interp.data.computed_recall import ComputedRecallSpec, computed_positions
from smelt_interp.errors import DataError
from smelt_interp.measure.batching import (
    DEFAULT_BATCH,
    Batch,
    capture,
    inference,
    make_batch,
    micro_batches,
)
from smelt_interp.measure.computed_case import row_lengths
from smelt_interp.model.protocol import LoopedModel, hook_name

ABLATED_VISIT = 1  # the visit whose heads are ablated in a looped layer
MEAN_VISIT = 0  # the visit whose z gives the mean that replaces them
COLUMNS = ("layer", "visit", "head", "accuracy_before", "accuracy_after", "drop")
SINGLE_VISIT_NOTE = (
    "the model visits each layer once: every head is ablated at its only visit (visit 0) "
    "by its mean there"
)
NO_DROP_NOTE = (
    "no head's ablation lowers accuracy: the chosen head (the first of the largest drop) is "
    "not one accuracy rests on"
)

Hook = tuple[str, Callable[..., torch.Tensor]]


@dataclass(frozen=True)
class HeadChoice:
    """`table` (COLUMNS): one row per candidate head, accuracy at the answer positions before
    and after its ablation and the drop; the chosen head (`layer`, `head`), ablated at
    `visit`; `note`: how the candidates were ablated where that is not visit 1, and whether no
    ablation lowered accuracy ('' otherwise)."""

    table: pd.DataFrame
    layer: int
    head: int
    visit: int
    note: str = ""


def candidates(model: LoopedModel) -> tuple[int, list[int], str]:
    """(the visit ablated, the layers whose heads are candidates, note): the layers that run a
    visit 1 at visit 1, or for a model with none every layer at visit 0."""
    looped = sorted({layer for layer, visit in model.schedule if visit == ABLATED_VISIT})
    if looped:
        return ABLATED_VISIT, looped, ""
    return MEAN_VISIT, sorted({layer for layer, _ in model.schedule}), SINGLE_VISIT_NOTE


def mean_z(
    model: LoopedModel,
    rows: torch.Tensor,
    layers: list[int],
    visit: int = MEAN_VISIT,
    batch_size: int = DEFAULT_BATCH,
) -> dict[int, torch.Tensor]:
    """{layer: [n_heads, d_head] float64}: each head's `attn.hook_z` at (layer, visit), averaged
    over the valid positions of `rows` (right padding left out)."""
    batch = make_batch(model, rows, row_lengths(rows))
    names = {layer: hook_name(layer, visit, "attn.hook_z") for layer in layers}
    sums = {layer: torch.zeros((), dtype=torch.float64) for layer in layers}
    count = 0
    for mb in micro_batches(batch, batch_size, "mean z"):
        _, cache = capture(model, mb.tokens, names.values())
        for layer, name in names.items():
            z = cache[name][mb.valid].double().cpu()  # [positions, heads, d_head]
            sums[layer] = sums[layer] + z.sum(dim=0)
        count += int(mb.valid.sum())
    return {layer: total / count for layer, total in sums.items()}


def answer_accuracy(
    model: LoopedModel,
    batch: Batch,
    answer: torch.Tensor,
    targets: torch.Tensor,
    hooks: list[Hook] | None = None,
    batch_size: int = DEFAULT_BATCH,
) -> float:
    """Share of the `answer` positions [n, T] whose greedy (argmax) next token is its target,
    over the rows of `batch`, run with forward `hooks` (edits) when given."""
    hits = total = 0
    for mb in micro_batches(batch, batch_size, "answer accuracy"):
        width = mb.tokens.shape[1]
        with inference(model):
            logits = model.run_with_hooks(mb.tokens, fwd_hooks=hooks or [])
        at = answer[mb.rows, :width].to(logits.device)
        right = logits.argmax(dim=-1) == targets[mb.rows, :width].to(logits.device)
        hits += int((right & at).sum())
        total += int(at.sum())
    if not total:
        raise DataError("the computed-recall rows hold no answer position")
    return hits / total


def mean_ablation_hook(layer: int, visit: int, head: int, mean: torch.Tensor) -> Hook:
    """The forward hook that replaces `head`'s z at (layer, visit) by `mean` [d_head]."""

    def edit(z: torch.Tensor, hook: object = None) -> torch.Tensor:
        z = z.clone()
        z[:, :, head] = mean.to(device=z.device, dtype=z.dtype)
        return z

    return hook_name(layer, visit, "attn.hook_z"), edit


def choose_head(
    model: LoopedModel,
    rows: torch.Tensor,
    spec: ComputedRecallSpec,
    *,
    batch_size: int = DEFAULT_BATCH,
) -> HeadChoice:
    """The tracked head of `model` on the validation `rows` [n, T] (computed-recall rows of
    `spec`): every candidate head mean-ablated in turn (see the module docstring), the one
    whose ablation drops answer-position accuracy the most chosen."""
    positions = computed_positions(rows, spec)
    if not bool(positions.answer.any()):
        raise DataError("the computed-recall rows hold no answer position")
    batch = make_batch(model, rows, row_lengths(rows))
    visit, layers, note = candidates(model)
    means = mean_z(model, rows, layers, MEAN_VISIT, batch_size)

    def score(hooks: list[Hook] | None) -> float:
        return answer_accuracy(model, batch, positions.answer, positions.targets, hooks, batch_size)

    before = score(None)
    records = []
    for layer in layers:
        for head in range(model.cfg.n_heads):
            after = score([mean_ablation_hook(layer, visit, head, means[layer][head])])
            records.append((layer, visit, head, before, after, before - after))
    table = pd.DataFrame(records, columns=list(COLUMNS))
    best = table.loc[table["drop"].idxmax()]
    if best["drop"] <= 0:  # a choice among equals: say so rather than name a head that matters
        note = "; ".join(filter(None, [note, NO_DROP_NOTE]))
    return HeadChoice(table, int(best["layer"]), int(best["head"]), visit, note)
