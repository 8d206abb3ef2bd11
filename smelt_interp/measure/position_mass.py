"""Attention mass of per-query position sets over per-query key sets, written once: for every
query position in a group (an answer position with n demonstrations, a non-answer position, ...)
the attention it puts on each of its key sets (BOS, its demonstration answers, ...), summed in
float64 per row, group, head and set. The case-study probe (probes/) and the trainer's
periodic case-study evaluation (train/) both read it here, in the measurement layer.

Attention rows come either from cached post-RoPE Q and K (`qk_rows`: the scores of one chunk of
queries [b, heads, chunk, keys] are normalised over the causally visible keys, reduced and
dropped, so memory is O(chunk x keys) per head; the fused path never materialises the pattern)
or from a materialised `hook_pattern` (`pattern_rows`, for references), or are those of uniform
attention over the visible keys (`uniform_rows`: the chance level of every key set, the share
of a query's keys it holds). With `entropy`, the reduction also sums each query's attention
entropy (nats) over the queries of a group, as one more statistic after the key sets. GQA:
query head h reads kv head h // n_group. A model that hides keys from some layers
(ModelConfig.hidden_key_ids) gives each such layer's mask (SmeltModel.hidden_keys) as `hidden`,
so the recomputed rows are the model's own."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from smelt_interp.model.protocol import hook_name

DEFAULT_CHUNK = 128
QK_HOOKS = ("attn.hook_q", "attn.hook_k")
PATTERN_HOOKS = ("attn.hook_pattern",)
# What a model's rows are read from (ModelShape.attention_source) -> the per-visit hooks it takes.
ROW_HOOKS = {"qk": QK_HOOKS, "pattern": PATTERN_HOOKS}

# (query positions [b, c], n_keys) -> attention probabilities [b, H, c, n_keys]
RowsFn = Callable[[torch.Tensor, int], torch.Tensor]


def attention_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    q_pos: torch.Tensor,
    n_keys: int | None = None,
    dtype: torch.dtype = torch.float32,
    hidden: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention probabilities [b, H, n, n_keys] of the queries at positions `q_pos`
    ([n] or [b, n]) over keys 0..n_keys-1. q [b, T, H, d], k [b, T, H_kv, d], post-RoPE;
    `hidden` [b, T]: keys no query sees (key 0 must stay visible)."""
    b, _, n_heads, d_head = q.shape
    n_kv = k.shape[2]
    group = n_heads // n_kv
    if q_pos.dim() == 1:
        q_pos = q_pos[None].expand(b, -1)
    q_pos = q_pos.to(q.device)
    n = q_pos.shape[1]
    n_keys = k.shape[1] if n_keys is None else n_keys
    rows = torch.gather(q, 1, q_pos[:, :, None, None].expand(-1, -1, n_heads, d_head))
    rows = rows.to(dtype).view(b, n, n_kv, group, d_head).permute(0, 2, 3, 1, 4)  # [b, kv, g, n, d]
    keys = k[:, :n_keys].to(dtype).permute(0, 2, 1, 3)[:, :, None]  # [b, kv, 1, K, d]
    scores = (rows @ keys.transpose(-1, -2)).reshape(b, n_heads, n, n_keys) / math.sqrt(d_head)
    visible = torch.arange(n_keys, device=q.device)[None, None, None, :] <= q_pos[:, None, :, None]
    if hidden is not None:
        visible = visible & ~hidden[:, None, None, :n_keys].to(q.device)
    scores = scores.masked_fill(~visible, float("-inf"))
    return (scores - scores.logsumexp(dim=-1, keepdim=True)).exp()


def qk_rows(q: torch.Tensor, k: torch.Tensor, hidden: torch.Tensor | None = None) -> RowsFn:
    """Attention rows recomputed from one visit's cached Q and K (`hidden`: its layer's hidden
    keys [b, T], see attention_rows)."""
    return lambda pos, n_keys: attention_rows(q, k, pos, n_keys, hidden=hidden)


def pattern_rows(pattern: torch.Tensor) -> RowsFn:
    """Attention rows read from one visit's `hook_pattern` [b, H, T, T] (positions [n] or
    [b, n], as attention_rows takes them)."""

    def rows(pos: torch.Tensor, n_keys: int) -> torch.Tensor:
        b, n_heads, _, t = pattern.shape
        if pos.dim() == 1 and len(pos) and bool((pos.diff() == 1).all()):
            first = int(pos[0])  # consecutive queries (a chunk): a view, no copy
            return pattern[:, :, first : first + len(pos), :n_keys]
        if pos.dim() == 1:
            pos = pos[None].expand(b, -1)
        index = pos.to(pattern.device)[:, None, :, None].expand(b, n_heads, -1, t)
        return pattern.gather(2, index)[..., :n_keys]

    return rows


def uniform_rows(q_pos: torch.Tensor, n_keys: int) -> torch.Tensor:
    """Uniform causal attention [b, 1, c, n_keys]: 1 / (q + 1) on each key 0..q of query q.
    Its mass on a key set is the set's share of the visible keys, the set's chance level."""
    keys = torch.arange(n_keys, device=q_pos.device)
    visible = keys[None, None, :] <= q_pos[:, :, None]
    return (visible.double() / (q_pos[:, :, None] + 1).double())[:, None]


def prompt_set_mass(
    weights: np.ndarray, queries: Sequence[int], keys: Mapping[int, Sequence[int]]
) -> np.ndarray:
    """Per head, the mean over one prompt's `queries` q of the attention on its key set
    keys[q], read from the prompt's pattern weights [H, T, T]: [H] (zeros with no query)."""
    if not queries:
        return np.zeros(weights.shape[0])
    return np.mean([weights[:, q, list(keys[q])].sum(axis=-1) for q in queries], axis=0)


def key_set_masses(row: np.ndarray, key_sets: Mapping[str, Sequence[int]]) -> dict[str, float]:
    """One attention row's mass (weights over keys [K]) on each named key set."""
    return {name: float(row[list(keys)].sum()) for name, keys in key_sets.items()}


def pattern_answer_masses(
    patterns: Mapping[tuple[int, int], np.ndarray],
    answer: Sequence[int],
    demos: Mapping[int, Sequence[int]],
) -> pd.DataFrame:
    """Per (layer, visit, head) of one prompt's patterns ({(layer, visit): [H, T, T]}, in
    schedule order), the mean over its answer positions of the mass on BOS and on their
    demonstration answers (key 0 left out: it is BOS): columns layer, visit, depth, head,
    bos_mass, demo_mass (NaN with no answer position)."""
    bos_keys = {q: [0] for q in answer}
    demo_keys = {q: [k for k in demos[q] if k != 0] for q in answer}
    rows = []
    for depth, ((layer, visit), weights) in enumerate(patterns.items()):
        nan = np.full(weights.shape[0], np.nan)
        bos = prompt_set_mass(weights, answer, bos_keys) if answer else nan
        demo = prompt_set_mass(weights, answer, demo_keys) if answer else nan
        for head in range(weights.shape[0]):
            rows.append(
                {
                    "layer": layer,
                    "visit": visit,
                    "depth": depth,
                    "head": head,
                    "bos_mass": float(bos[head]),
                    "demo_mass": float(demo[head]),
                }
            )
    return pd.DataFrame(rows)


def row_entropy(rows: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each attention row [..., K] -> [...] (0 log 0 = 0)."""
    return -torch.special.xlogy(rows, rows).sum(dim=-1)


def grouped_mass(
    rows_of: RowsFn,
    q_pos: torch.Tensor,
    q_group: torch.Tensor,
    n_groups: int,
    key_sets: torch.Tensor,
    chunk: int | None = DEFAULT_CHUNK,
    entropy: bool = False,
) -> torch.Tensor:
    """Attention mass on each key set summed over the queries of each group: [b, G, H, S]
    (float64), or [b, G, H, S + 1] with `entropy`, the last statistic the attention entropy
    (nats) summed over the group's queries.

    q_pos, q_group [b, n]: query positions and the group each counts in (-1: none);
    key_sets: 0/1 indicators of the keys in each set, [b, S, T] (the same sets for every query
    of a row) or [b, n, S, T] (per query, aligned with q_pos)."""
    b, n = q_pos.shape
    per_query = key_sets.dim() == 4
    step = n if chunk is None else max(1, int(chunk))
    out: torch.Tensor | None = None
    for lo in range(0, n, step):
        pos, group = q_pos[:, lo : lo + step], q_group[:, lo : lo + step].to(q_pos.device)
        n_keys = int(pos.max()) + 1
        rows = rows_of(pos, n_keys).double()  # [b, H, c, K]
        if per_query:
            sets = key_sets[:, lo : lo + step, :, :n_keys].to(rows.device, torch.float64)
            mass = torch.einsum("bhck,bcsk->bchs", rows, sets)
        else:
            sets = key_sets[:, :, :n_keys].to(rows.device, torch.float64)
            mass = torch.einsum("bhck,bsk->bchs", rows, sets)
        if entropy:
            mass = torch.cat([mass, row_entropy(rows).permute(0, 2, 1)[..., None]], dim=-1)
        part = torch.einsum("bchs,bcg->bghs", mass, group_members(group, n_groups))
        out = part if out is None else out + part
    assert out is not None  # n >= 1
    return out


def group_members(q_group: torch.Tensor, n_groups: int) -> torch.Tensor:
    """[b, n, G] float64 one-hot of each query's group (all zero for group -1)."""
    return F.one_hot(q_group.clamp(min=0), n_groups).double() * (q_group >= 0)[..., None]


def group_sums(values: torch.Tensor, q_group: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Per-query `values` [b, n] summed over the queries of each group: [b, G] (float64)."""
    return torch.einsum("bn,bng->bg", values.double(), group_members(q_group, n_groups))


def group_counts(q_group: torch.Tensor, n_groups: int) -> torch.Tensor:
    """How many queries of each row count in each group: [b, G] (float64)."""
    return group_members(q_group, n_groups).sum(dim=1)


def key_set_mass(
    q: torch.Tensor,
    k: torch.Tensor,
    q_pos: torch.Tensor,
    q_valid: torch.Tensor,
    key_sets: torch.Tensor,
    chunk: int | None = DEFAULT_CHUNK,
    hidden: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention mass on each key set, summed over valid queries: [b, H, S] (float64).

    q_pos, q_valid [b, n]: query positions and which of them count; key_sets [b, S, T] or,
    per query, [b, n, S, T]: 0/1 indicators of the keys in each set; `hidden` [b, T]: the
    layer's hidden keys."""
    group = torch.where(q_valid.to(q_pos.device), 0, -1)
    return grouped_mass(qk_rows(q, k, hidden), q_pos, group, 1, key_sets, chunk)[:, 0]


def row_hooks(source: str) -> tuple[str, ...]:
    """The per-visit hooks a model's attention rows are read from (see visit_rows)."""
    try:
        return ROW_HOOKS[source]
    except KeyError:
        known = sorted(ROW_HOOKS)
        raise ValueError(f"attention_source must be one of {known}, got {source!r}") from None


def qk_hook_names(schedule: Sequence[tuple[int, int]], source: str = "qk") -> list[str]:
    """The hook points `visit_masses` and `visit_rows` read at every visit of `schedule`: its
    Q and K, or its pattern for a model whose rows are read from it."""
    hooks = row_hooks(source)
    return [hook_name(layer, visit, h) for layer, visit in schedule for h in hooks]


def visit_rows(
    source: str,
    cache: Mapping[str, torch.Tensor],
    layer: int,
    visit: int,
    hidden: torch.Tensor | None = None,
) -> RowsFn:
    """One visit's attention rows from a cache holding its `row_hooks(source)`: recomputed from
    post-RoPE Q and K ('qk', with the layer's hidden keys), or read from the model's own eager
    pattern ('pattern': its masks, windows, biases and learned sinks already applied)."""
    if source == "pattern":
        return pattern_rows(cache[hook_name(layer, visit, "attn.hook_pattern")])
    q, k = (cache[hook_name(layer, visit, h)] for h in row_hooks(source))
    return qk_rows(q, k, hidden)


def visit_masses(
    cache: Mapping[str, torch.Tensor],
    schedule: Sequence[tuple[int, int]],
    q_group: torch.Tensor,
    n_groups: int,
    key_sets: torch.Tensor,
    chunk: int | None = DEFAULT_CHUNK,
    entropy: bool = False,
    hidden: Mapping[int, torch.Tensor] | None = None,
    source: str = "qk",
) -> torch.Tensor:
    """grouped_mass of every query position 0..T-1 at every visit, from the cached hooks of
    `source` (see visit_rows): [b, visits (schedule order), G, H, S (+ 1 with `entropy`)]
    (float64). q_group [b, T]; key_sets [b, T, S, T]; `hidden`: the hidden keys [b, T] of each
    layer that hides some (SmeltModel.hidden_keys)."""
    b, t = q_group.shape
    pos = torch.arange(t, device=q_group.device)[None].expand(b, -1)
    hidden = hidden or {}
    per_visit = [
        grouped_mass(
            visit_rows(source, cache, layer, visit, hidden.get(layer)),
            pos,
            q_group,
            n_groups,
            key_sets,
            chunk,
            entropy,
        )
        for layer, visit in schedule
    ]
    return torch.stack(per_visit, dim=1)


def uniform_masses(
    q_group: torch.Tensor, n_groups: int, key_sets: torch.Tensor, chunk: int | None = DEFAULT_CHUNK
) -> torch.Tensor:
    """The chance levels beside visit_masses: uniform attention's mass on each key set and its
    entropy (log of the visible keys), summed over the queries of each group, [b, G, S + 1]."""
    b, t = q_group.shape
    pos = torch.arange(t, device=q_group.device)[None].expand(b, -1)
    return grouped_mass(uniform_rows, pos, q_group, n_groups, key_sets, chunk, True)[:, :, 0]
