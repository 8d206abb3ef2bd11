"""Attention statistics recomputed from cached post-RoPE Q and K, a chunk of queries at a time.

The model's fused path never materialises the pattern, and the explicit one holds
[b, heads, T, T]. Here the scores of one chunk of queries, [b, heads, chunk, keys], are
normalised with a log-sum-exp over the (causally visible) keys, reduced to the statistic, and
dropped, so memory is O(chunk x keys) per head. GQA: query head h reads kv head h // n_group.
The BOS column (measure.sink) and top-k overlap are reductions of these rows; the case study's
key-set masses and the row computation itself live in measure.position_mass. `hidden` [b, T]
is the visit's layer's hidden keys (SmeltModel.hidden_keys), for a model that hides some."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from smelt_interp.measure.position_mass import DEFAULT_CHUNK, attention_rows, key_set_mass

__all__ = [  # the row computation and key-set masses re-exported beside the chunked reductions
    "DEFAULT_CHUNK",
    "attention_rows",
    "causal_chunks",
    "key_set_mass",
    "overlap_count",
    "pattern",
    "topk_overlap_sum",
]


def causal_chunks(
    q: torch.Tensor,
    k: torch.Tensor,
    chunk: int | None = DEFAULT_CHUNK,
    dtype: torch.dtype = torch.float32,
    hidden: torch.Tensor | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(positions [c], rows [b, H, c, last+1]) for consecutive chunks of all queries; keys past
    the chunk's last query are never visible, so they are not computed. chunk=None: one chunk."""
    t = q.shape[1]
    step = t if chunk is None else max(1, int(chunk))
    for lo in range(0, t, step):
        pos = torch.arange(lo, min(t, lo + step), device=q.device)
        yield pos, attention_rows(q, k, pos, int(pos[-1]) + 1, dtype, hidden)


def pattern(
    q: torch.Tensor,
    k: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    hidden: torch.Tensor | None = None,
) -> torch.Tensor:
    """The whole pattern [b, H, T, T] (for short sequences: heatmaps, references)."""
    positions = torch.arange(q.shape[1], device=q.device)
    return attention_rows(q, k, positions, dtype=dtype, hidden=hidden)


def topk_overlap_sum(
    q_a: torch.Tensor,
    k_a: torch.Tensor,
    q_b: torch.Tensor,
    k_b: torch.Tensor,
    valid: torch.Tensor,
    top: int = 8,
    chunk: int | None = DEFAULT_CHUNK,
    hidden_a: torch.Tensor | None = None,
    hidden_b: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per query and head, the fraction of its `top` most attended keys that two attention
    computations share, summed over the valid queries that see MORE than `top` keys (i >= top):
    [b, H] (float64). A query with `top` or fewer visible keys attends to all of them in both
    computations, so it would count as full overlap by construction; it is left out (divide by
    `overlap_count`). `hidden_a`, `hidden_b`: the hidden keys of each computation's layer."""
    out = torch.zeros(valid.shape[0], q_a.shape[2], dtype=torch.float64, device=q_a.device)
    for (pos, rows_a), (_, rows_b) in zip(
        causal_chunks(q_a, k_a, chunk, hidden=hidden_a),
        causal_chunks(q_b, k_b, chunk, hidden=hidden_b),
    ):
        if rows_a.shape[-1] <= top:  # every query of this chunk sees top keys or fewer
            continue
        idx_a = rows_a.topk(top, dim=-1).indices  # [b, H, c, top]
        idx_b = rows_b.topk(top, dim=-1).indices
        same = (idx_a[..., :, None] == idx_b[..., None, :]).sum(dim=(-1, -2)).double() / top
        keep = valid[:, pos] & (pos >= top)[None, :]  # [b, c]
        out += (same * keep[:, None, :]).sum(dim=-1)
    return out


def overlap_count(valid: torch.Tensor, top: int = 8) -> torch.Tensor:
    """How many valid queries see more than `top` keys (the ones topk_overlap_sum counts)."""
    return valid[:, top:].sum()
