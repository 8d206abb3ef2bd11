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

from smelt_interp.measure.position_mass import (
    DEFAULT_CHUNK,
    RowsFn,
    attention_rows,
    key_set_mass,
    qk_rows,
)

__all__ = [  # the row computation and key-set masses re-exported beside the chunked reductions
    "DEFAULT_CHUNK",
    "attention_rows",
    "causal_chunks",
    "key_set_mass",
    "head_overlap",
    "overlap_count",
    "pattern",
    "row_chunks",
    "topk_overlap_rows",
    "topk_overlap_sum",
    "without_bos",
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
    rows_of = lambda pos, n_keys: attention_rows(q, k, pos, n_keys, dtype, hidden)
    yield from row_chunks(rows_of, q.shape[1], chunk, q.device)


def row_chunks(
    rows_of: RowsFn, t: int, chunk: int | None = DEFAULT_CHUNK, device: torch.device | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """causal_chunks for any source of rows (measure.position_mass.visit_rows): (positions
    [c], rows [b, H, c, last+1]) over the t queries, a chunk at a time."""
    step = t if chunk is None else max(1, int(chunk))
    for lo in range(0, t, step):
        pos = torch.arange(lo, min(t, lo + step), device=device)
        yield pos, rows_of(pos, int(pos[-1]) + 1)


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
    return topk_overlap_rows(
        qk_rows(q_a, k_a, hidden_a), qk_rows(q_b, k_b, hidden_b), valid, top, chunk
    )


def topk_overlap_rows(
    rows_a: RowsFn,
    rows_b: RowsFn,
    valid: torch.Tensor,
    top: int = 8,
    chunk: int | None = DEFAULT_CHUNK,
) -> torch.Tensor:
    """topk_overlap_sum for any two sources of rows over the same valid [b, T] queries."""
    t, device = valid.shape[1], valid.device
    out: torch.Tensor | None = None
    for (pos, part_a), (_, part_b) in zip(
        row_chunks(rows_a, t, chunk, device), row_chunks(rows_b, t, chunk, device)
    ):
        if out is None:
            out = torch.zeros(valid.shape[0], part_a.shape[1], dtype=torch.float64, device=device)
        if part_a.shape[-1] <= top:  # every query of this chunk sees top keys or fewer
            continue
        idx_a = part_a.topk(top, dim=-1).indices  # [b, H, c, top]
        idx_b = part_b.topk(top, dim=-1).indices
        same = (idx_a[..., :, None] == idx_b[..., None, :]).sum(dim=(-1, -2)).double() / top
        keep = valid[:, pos] & (pos >= top)[None, :]  # [b, c]
        out += (same * keep[:, None, :]).sum(dim=-1).to(device)
    assert out is not None  # t >= 1
    return out


def head_overlap(
    rows_a: RowsFn,
    rows_b: RowsFn,
    valid: torch.Tensor,
    top: int = 8,
    chunk: int | None = DEFAULT_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_overlap_rows summed over the rows [H], overlap_count): what a micro-batch adds to
    a per-head overlap pooled over rows (measure.batching.Accumulator)."""
    return topk_overlap_rows(rows_a, rows_b, valid, top, chunk).sum(dim=0), overlap_count(
        valid, top
    )


def overlap_count(valid: torch.Tensor, top: int = 8) -> torch.Tensor:
    """How many valid queries see more than `top` keys (the ones topk_overlap_sum counts)."""
    return valid[:, top:].sum()


def without_bos(pattern: torch.Tensor) -> torch.Tensor:
    """Pattern [.., q, k] with key 0 zeroed for queries >= 1 and rows renormalised (a row with
    nothing left keeps its weights)."""
    edited = pattern.clone()
    edited[..., 1:, 0] = 0
    rest = edited.sum(dim=-1, keepdim=True)
    return torch.where(rest > 0, edited / rest.clamp_min(torch.finfo(rest.dtype).tiny), pattern)
