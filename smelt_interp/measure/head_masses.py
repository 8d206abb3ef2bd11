"""Attention statistics pooled per (layer, visit, head), the result the probes, the trainer's
evaluations and the dashboard read: each mass as the mean over every counted query of every
row (sums over rows and queries divided by the queries counted, here and nowhere else), with
uniform attention's level at the same queries and how many queries were pooled. The sink
probe's comes from `sink_masses`; the case study's key-set masses at a group of positions
(the trainer's periodic evaluation, the head ablation) from GroupMasses.head_masses
(measure.group_masses); the case study's tables pool the same sums with bootstrap intervals
(measure.case_tables).

`sink_masses` is the sink probe's: the BOS (or, for a model that adds no BOS, first-token) mass
over valid queries i >= 1 at the rows' full length and on their first WINDOW tokens, the
learned-sink slot mass for a model with sink logits, and beside them the BOS value-norm ratio
(the norm of v at BOS over the mean norm of v at the other valid positions, for the kv head
the query head reads). One forward pass per micro-batch; both lengths are read off the same
first-key columns (measure.sink.first_key_columns)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from smelt_interp.measure.attention_stats import DEFAULT_CHUNK
from smelt_interp.measure.batching import (
    DEFAULT_BATCH,
    Accumulator,
    capture,
    make_batch,
    micro_batches,
    visit_names,
)
from smelt_interp.measure.levels import uniform_bos
from smelt_interp.measure.position_mass import qk_hook_names, visit_rows
from smelt_interp.measure.sink import WINDOW, first_key_columns
from smelt_interp.measure.sink_gu import GU_KEY, THRESHOLD, first_key_importance, head_totals
from smelt_interp.model.protocol import LoopedModel, hook_name

W = f"_{WINDOW}"  # suffix of the windowed statistics


@dataclass(frozen=True)
class HeadMasses:
    """Statistics per (layer, visit, head) pooled over rows: `values[name]` [visits (schedule
    order), heads], uniform attention's level at the same queries `uniform[name]` (absent for
    a statistic without one) and the queries pooled `counts[name]`."""

    schedule: tuple[tuple[int, int], ...]
    values: Mapping[str, np.ndarray]
    uniform: Mapping[str, float]
    counts: Mapping[str, int]

    def frame(self) -> pd.DataFrame:
        """One row per (layer, visit, head): layer, visit, depth, head, then each statistic."""
        rows = []
        for depth, (layer, visit) in enumerate(self.schedule):
            for head in range(next(iter(self.values.values())).shape[1]):
                row = {"layer": layer, "visit": visit, "depth": depth, "head": head}
                rows.append(row | {k: float(v[depth, head]) for k, v in self.values.items()})
        return pd.DataFrame(rows)


def _value_norms(v: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over rows of |v| at BOS, sum over valid positions i >= 1 of |v|): [kv] each."""
    norms = v.double().norm(dim=-1)  # [b, T, kv]
    rest = valid.clone()
    rest[:, 0] = False
    return norms[:, 0].sum(dim=0), (norms * rest[..., None]).sum(dim=(0, 1))


def sink_masses(
    model: LoopedModel,
    tokens: torch.Tensor,
    lengths: torch.Tensor | Sequence[int] | None = None,
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
    threshold: float = THRESHOLD,
) -> HeadMasses:
    """`sink_mass` and `sink_mass_64` (queries 1..63 only), each beside its uniform level,
    `sink_slot_mass` for a model with learned sinks, `v_norm_ratio` (no level), and Gu et al.'s
    per-sample figures (measure.sink_gu, query 0 kept, first WINDOW tokens of each row):
    `first_key_importance_64` (mean over rows) and `sink03_gu` (the share of rows whose
    importance exceeds `threshold`)."""
    batch = make_batch(model, tokens, lengths)
    source, slots = model.cfg.attention_source, model.cfg.learned_sinks
    names = qk_hook_names(model.schedule, source)
    names += visit_names(model, model.schedule, "attn.hook_v")
    acc = Accumulator()
    for mb in micro_batches(batch, batch_size, "sink"):
        _, cache = capture(model, mb.tokens, names)
        hidden = model.hidden_keys(mb.tokens)
        n_queries = (mb.lengths - 1).sum()
        n_window = mb.valid[:, 1:WINDOW].sum()
        n_rest = mb.valid[:, 1:].sum()
        for layer, visit in model.schedule:
            rows_of = visit_rows(source, cache, layer, visit, hidden.get(layer))
            first, slot = first_key_columns(rows_of, mb.valid, chunk)
            importance, over = head_totals(first_key_importance(rows_of, mb.valid), threshold)
            acc.add((layer, visit, f"first_key_importance{W}"), importance, mb.size)
            acc.add((layer, visit, GU_KEY), over, mb.size)
            column = first.sum(dim=0)  # [H, T]
            acc.add((layer, visit, "sink_mass"), column.sum(dim=-1), n_queries)
            acc.add((layer, visit, f"sink_mass{W}"), column[:, :WINDOW].sum(dim=-1), n_window)
            if slots:
                acc.add((layer, visit, "sink_slot_mass"), slot.sum(dim=(0, 2)), n_queries)
            bos, rest = _value_norms(cache[hook_name(layer, visit, "attn.hook_v")], mb.valid)
            acc.add((layer, visit, "v_bos"), bos, mb.size)
            acc.add((layer, visit, "v_rest"), rest, n_rest)
    return _sink_result(model, acc, batch.lengths.cpu(), slots)


def _sink_result(
    model: LoopedModel, acc: Accumulator, lengths: torch.Tensor, slots: bool
) -> HeadMasses:
    """The pooled means of sink_masses' sums, heads reading a kv head given its ratio."""
    group, schedule = model.cfg.n_group, tuple(model.schedule)
    gu = [f"first_key_importance{W}", GU_KEY]
    stats = ["sink_mass", f"sink_mass{W}", *gu] + (["sink_slot_mass"] if slots else [])
    values = {stat: np.stack([acc.mean((*lv, stat)).numpy() for lv in schedule]) for stat in stats}
    ratios = [acc.mean((*lv, "v_bos")) / acc.mean((*lv, "v_rest")) for lv in schedule]
    n_heads = values["sink_mass"].shape[1]
    heads_kv = [head // group for head in range(n_heads)]
    values["v_norm_ratio"] = np.stack([ratio.numpy()[heads_kv] for ratio in ratios])
    order = ["sink_mass", f"sink_mass{W}", "v_norm_ratio"] + stats[2:]  # Gu's, then the slot
    first = schedule[0]
    counts = {stat: int(acc.counts[(*first, stat)]) for stat in stats}
    uniform = {"sink_mass": uniform_bos(lengths), f"sink_mass{W}": uniform_bos(lengths, WINDOW)}
    return HeadMasses(schedule, {k: values[k] for k in order}, uniform, counts)
