"""The case study's reduction of a model's attention to masses: per row of a task's batch
(Dyck prompts, or associative-recall rows) and per position group (each demonstration count,
then the non-answer positions), the attention mass on each key set summed over the group's
positions, the positions counted, the model's next-token hits there and uniform attention's
sums over the same positions, from one forward pass per micro-batch. measure.case_tables turns
these into the case study's tables (probes.case_study, the seeds command); a group's masses
pooled per (layer, visit, head), GroupMasses.head_masses, are what the trainer's periodic
evaluation and the head ablation read."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from smelt_interp.data.dyck import DyckExample, dyck_batch
from smelt_interp.errors import DataError
from smelt_interp.measure.batching import DEFAULT_BATCH, capture, make_batch, micro_batches
from smelt_interp.measure.case_positions import MAX_DEMOS, CasePositions, dyck_case, recall_case
from smelt_interp.measure.head_masses import HeadMasses
from smelt_interp.measure.levels import pooled_level
from smelt_interp.measure.position_mass import (
    DEFAULT_CHUNK,
    group_counts,
    group_sums,
    qk_hook_names,
    uniform_masses,
    visit_masses,
)
from smelt_interp.model.protocol import LoopedModel

# measure.case_positions.KEY_SETS, then the attention entropy (nats)
MASS_STATS = ("bos_mass", "demo_mass", "prev_mass", "self_mass", "rest_mass")
STATS = (*MASS_STATS, "entropy")


@dataclass(frozen=True)
class GroupMasses:
    """The rows (prompts) with positions of one group (a demonstration count, or the non-answer
    positions): per row, the attention mass summed over those positions, sums [n, visits
    (schedule order), heads, stats], how many positions it has, counts [n], and uniform
    attention's sums over the same positions, reference [n, stats] (None when not known)."""

    sums: np.ndarray
    counts: np.ndarray
    reference: np.ndarray | None = None

    @property
    def n_positions(self) -> int:
        """How many positions the group holds, over all its rows."""
        return int(self.counts.sum())

    def uniform(self) -> dict[str, float]:
        """{stat: uniform attention's level} over the group's positions, pooled over rows."""
        assert self.reference is not None
        level = pooled_level(self.reference, self.counts)
        return {stat: float(level[s]) for s, stat in enumerate(STATS)}

    def head_masses(self, schedule: Sequence[tuple[int, int]]) -> HeadMasses:
        """Every statistic's mean per position over the group, pooled over rows, per (layer,
        visit, head) of `schedule`, with uniform attention's levels (when known) and the
        positions counted (NaN masses where none is)."""
        with np.errstate(invalid="ignore", divide="ignore"):  # no position: NaN, said by counts
            mean = self.sums.sum(axis=0) / self.counts.sum()  # [visits, heads, S]
        stats = STATS[: mean.shape[-1]]
        values = {stat: mean[..., s] for s, stat in enumerate(stats)}
        uniform = self.uniform() if self.reference is not None else {}
        counts = dict.fromkeys(stats, self.n_positions)
        return HeadMasses(tuple(schedule), values, uniform, counts)


@dataclass(frozen=True)
class RowMasses:
    """Per row of a task's batch and per group (n_demos 0 .. G-2, then the non-answer
    positions): sums [n, visits, G, heads, 6 (STATS)], how many queries counted, counts
    [n, G], at how many the model's argmax is the next token, hits [n, G], and uniform
    attention's sums, reference [n, G, 6]."""

    sums: np.ndarray
    counts: np.ndarray
    hits: np.ndarray
    reference: np.ndarray

    def groups(self) -> dict[int, GroupMasses]:
        """{n_demos: GroupMasses} over the rows that have such answer positions."""
        return {g: self.group([g]) for g in range(self.counts.shape[1] - 1) if self.has([g])}

    def has(self, groups: Sequence[int]) -> bool:
        return bool(self.counts[:, list(groups)].sum() > 0)

    def group(self, groups: Sequence[int]) -> GroupMasses:
        """The positions of `groups` pooled, over the rows that have any."""
        return group_of(self.sums, self.counts, groups, self.reference)

    def answer(self) -> GroupMasses:
        """Every answer position with demonstrations (n_demos >= 1) pooled, or every answer
        position when none has any (Dyck words posed without demonstrations)."""
        shown = list(range(1, self.counts.shape[1] - 1))
        return self.group(shown if self.has(shown) else [0])

    def non_answer(self) -> GroupMasses:
        """Every statistic at the non-answer positions."""
        return self.group([self.counts.shape[1] - 1])


def group_of(
    sums: np.ndarray, counts: np.ndarray, groups: Sequence[int], reference: np.ndarray | None = None
) -> GroupMasses:
    """The positions of `groups` pooled, over the rows that have any, from RowMasses-shaped
    sums [n, visits, G, heads, S], counts [n, G] and uniform attention's sums [n, G, S]."""
    g = list(groups)
    total = counts[:, g].sum(axis=1)
    rows = total > 0
    pooled_reference = None if reference is None else reference[rows][:, g].sum(axis=1)
    return GroupMasses(sums[rows][:, :, g].sum(axis=2), total[rows], pooled_reference)


def concat(parts: Sequence[RowMasses]) -> RowMasses:
    """The rows of several RowMasses (same groups) in one."""
    names = [f.name for f in dataclasses.fields(RowMasses)]
    return RowMasses(*(np.concatenate([getattr(p, name) for p in parts]) for name in names))


def row_masses(
    model: LoopedModel,
    tokens: torch.Tensor,
    lengths: torch.Tensor | None,
    positions: CasePositions,
    n_groups: int,
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
) -> RowMasses:
    """Every row's mass sums, counts and next-token hits per group, from one forward pass per
    micro-batch (Q and K cached, the pattern recomputed a chunk of queries at a time)."""
    batch = make_batch(model, tokens, lengths)
    source = model.cfg.attention_source
    names = qk_hook_names(model.schedule, source)
    sums, counts, hits, reference = [], [], [], []
    for mb in micro_batches(batch, batch_size, "case study"):
        logits, cache = capture(model, mb.tokens, names)
        sets = positions.trimmed(mb.rows, mb.tokens.shape[1])
        groups = sets.groups(n_groups).to(mb.tokens.device)
        keys = sets.key_sets().to(mb.tokens.device)
        hidden = model.hidden_keys(mb.tokens)
        sums.append(
            visit_masses(cache, model.schedule, groups, n_groups, keys, chunk, True, hidden, source)
        )
        counts.append(group_counts(groups, n_groups))
        right = logits.argmax(dim=-1) == sets.targets.to(logits.device)
        hits.append(group_sums(right, groups, n_groups))
        reference.append(uniform_masses(groups, n_groups, keys, chunk))
    parts = (sums, counts, hits, reference)
    return RowMasses(*(torch.cat(x).cpu().numpy().astype(np.float64) for x in parts))


def by_demos(examples: Sequence[DyckExample]) -> dict[int, list[DyckExample]]:
    if not examples:
        raise DataError("the Dyck case study needs at least one example")
    groups: dict[int, list[DyckExample]] = defaultdict(list)
    for ex in examples:
        groups[ex.n_demos].append(ex)
    return dict(sorted(groups.items()))


def dyck_masses(
    model: LoopedModel,
    examples: Sequence[DyckExample],
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
) -> RowMasses:
    """RowMasses of the Dyck prompts, one padded batch per demonstration count."""
    groups = by_demos(examples)
    n_groups = max(groups) + 2
    parts = []
    for group in groups.values():
        tokens, lengths = dyck_batch(group)
        sets = dyck_case(group, tokens, lengths)
        parts.append(
            row_masses(model, tokens, lengths, sets, n_groups, batch_size=batch_size, chunk=chunk)
        )
    return concat(parts)


def recall_masses(
    model: LoopedModel,
    rows: torch.Tensor,
    trigger_ids: tuple[int, ...],
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
) -> RowMasses:
    """RowMasses of associative-recall rows [n, T] (held-out rows, or any hand-made ones)."""
    sets = recall_case(rows, trigger_ids)
    return row_masses(model, rows, None, sets, MAX_DEMOS + 2, batch_size=batch_size, chunk=chunk)
