"""The case study's position sets and masses on computed-class recall rows (data.computed_recall,
whose docstring defines the sets), in measure.case_positions' shape, so that a head's BOS and
matching-demonstration masses on these rows are the case study's own statistics (one reduction,
measure.group_masses.row_masses) rather than a second definition.

Groups, as for associative recall: an answer position (its class shown in an earlier
demonstration) counts in group n, its number of earlier demonstrations of that class (capped
at MAX_DEMOS); a first occurrence in group 0; every other query in the non-answer group. The
demonstration answers of an answer position are the label positions of those demonstrations
(ComputedPositions.demos), so `demo_mass` is the mass on the matching demonstrations' labels."""

from __future__ import annotations

import torch

from smelt_interp.data.computed_recall import ComputedRecallSpec, computed_positions
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.errors import DataError
from smelt_interp.measure.attention_stats import DEFAULT_CHUNK
from smelt_interp.measure.batching import DEFAULT_BATCH
from smelt_interp.measure.case_positions import MAX_DEMOS, CasePositions
from smelt_interp.measure.group_masses import RowMasses, row_masses
from smelt_interp.measure.head_masses import HeadMasses
from smelt_interp.model.protocol import LoopedModel

N_GROUPS = MAX_DEMOS + 2  # n_demos 0 .. MAX_DEMOS, then the non-answer positions


def row_lengths(tokens: torch.Tensor) -> torch.Tensor:
    """[b]: each right-padded row's valid length (the position of its first PAD, or the width)."""
    return (tokens != PAD_ID).long().cumprod(dim=1).sum(dim=1)


def computed_case(tokens: torch.Tensor, spec: ComputedRecallSpec) -> CasePositions:
    """The case study's sets of computed-recall rows [b, T] under `spec`: answer positions by
    their earlier demonstrations of the same class (capped at MAX_DEMOS), first occurrences in
    group 0."""
    sets = computed_positions(tokens, spec)
    earlier = sets.demos.sum(dim=-1).clamp(max=MAX_DEMOS)
    n_demos = torch.where(sets.answer, earlier, torch.where(sets.first, 0, -1))
    return CasePositions(n_demos.long(), sets.non_answer, sets.demos, sets.targets)


def computed_masses(
    model: LoopedModel,
    rows: torch.Tensor,
    spec: ComputedRecallSpec,
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
) -> RowMasses:
    """RowMasses (measure.group_masses) of computed-recall rows [n, T] under `spec`."""
    sets = computed_case(rows, spec)
    lengths = row_lengths(rows)
    return row_masses(model, rows, lengths, sets, N_GROUPS, batch_size=batch_size, chunk=chunk)


def answer_head_masses(
    model: LoopedModel,
    rows: torch.Tensor,
    spec: ComputedRecallSpec,
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
) -> HeadMasses:
    """Every statistic (bos_mass, demo_mass, ...) per (layer, visit, head), pooled over every
    answer position of the rows, with uniform attention's level at the same positions."""
    masses = computed_masses(model, rows, spec, batch_size=batch_size, chunk=chunk)
    answer = masses.group(range(1, N_GROUPS - 1))
    if not answer.n_positions:
        raise DataError("the computed-recall rows hold no answer position")
    return answer.head_masses(model.schedule)
