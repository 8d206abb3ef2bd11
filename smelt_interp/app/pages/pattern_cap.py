"""What one dashboard response may carry of an attention pattern.

A prompt of T tokens has [H, T, T] attention weights per (layer, visit): a million cells per head
for a 1,000-token prompt (about 19 MB of JSON for one heatmap), and for a 65,536-token context
more than any server holds. `capped(run)` wraps a PromptRun so that a pattern longer than
`side` positions is drawn as [H, side, side] block means (each cell the mean weight of the
queries and keys of its block), computed a chunk of queries at a time from the cached Q and K
(see measure.attention_stats), or from the captured pattern of a model whose rows are its
pattern (an adapted model's; PromptRun.rows), so neither the server's memory nor the response
grows with T². Blocks are labelled by the positions they span; a prompt of at most `side` tokens
is drawn as it is, cell for cell."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from smelt_interp.errors import ProbeError
from smelt_interp.measure.attention_stats import attention_rows
from smelt_interp.measure.position_mass import RowsFn, qk_rows
from smelt_interp.measure.sink import first_key_shares

MAX_CELLS = 1 << 18  # pattern cells in one response (every head of the grid): about 5 MB
MAX_SIDE = 256  # positions along one axis of a drawn pattern
MIN_SIDE = 16
CHUNK_CELLS = 1 << 22  # attention weights held at once while a pattern is pooled (16 MiB)


def side_for(n_heads: int) -> int:
    """Positions per axis so that every head of a grid fits in MAX_CELLS."""
    return max(MIN_SIDE, min(MAX_SIDE, math.isqrt(MAX_CELLS // max(1, n_heads))))


def block_edges(n: int, side: int) -> np.ndarray:
    """side + 1 increasing edges splitting positions 0..n into `side` blocks of near-equal size
    (n if n <= side: one position per block)."""
    return np.linspace(0, n, min(n, side) + 1).round().astype(int)


def pooled_pattern(
    q: torch.Tensor, k: torch.Tensor, side: int, hidden: torch.Tensor | None = None
) -> np.ndarray:
    """Block means [H, s, s] (s = min(T, side)) of the causal pattern of q [1, T, H, d] and
    k [1, T, H_kv, d] (`hidden` [1, T]: keys the layer hides), at most CHUNK_CELLS weights in
    memory at a time."""
    rows_of = lambda pos, n_keys: attention_rows(q, k, pos, n_keys, hidden=hidden)  # noqa: E731
    return pooled_rows(rows_of, q.shape[1], q.shape[2], side)


def pooled_rows(rows_of: RowsFn, t: int, n_heads: int, side: int) -> np.ndarray:
    """pooled_pattern of any source of rows [1, H, n, n_keys] (measure.position_mass.RowsFn)
    over `t` positions."""
    edges = block_edges(t, side)
    widths = np.diff(edges)
    out = np.zeros((n_heads, len(widths), len(widths)), dtype=np.float64)
    with torch.no_grad():
        for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
            step = max(1, CHUNK_CELLS // max(1, n_heads * int(hi)))
            total = np.zeros((n_heads, int(hi)), dtype=np.float64)
            for start in range(int(lo), int(hi), step):
                pos = torch.arange(start, min(int(hi), start + step))
                rows = rows_of(pos, int(hi))[0]  # [H, n, hi]
                total += rows.sum(dim=1).double().cpu().numpy()
            cols = np.add.reduceat(total, edges[:-1][edges[:-1] < hi], axis=1)
            out[:, i, : cols.shape[1]] = cols / (widths[i] * widths[None, : cols.shape[1]])
    return out.astype(np.float32)


def block_labels(labels: list[str], side: int) -> list[str]:
    """One label per block: the token itself, or the positions a wider block spans."""
    edges = block_edges(len(labels), side)
    return [
        labels[lo] if hi - lo == 1 else f"{lo}–{hi - 1}"
        for lo, hi in zip(edges[:-1], edges[1:], strict=True)
    ]


class DrawableRun:
    """A PromptRun whose patterns, labels, BOS shares and learned-sink shares are those a
    response may carry."""

    def __init__(self, run: Any, side: int) -> None:
        self.run = run
        self.side = side
        self.pooled = run.n_tokens > side
        self._cache = getattr(run, "_patterns", {})  # kept with the run, as its own patterns

    def __getattr__(self, name: str) -> Any:
        return getattr(self.run, name)

    @property
    def labels(self) -> list[str]:
        return block_labels(self.run.labels, self.side) if self.pooled else self.run.labels

    def pattern(self, layer: int, visit: int) -> np.ndarray:
        """[H, s, s]: the pattern itself, or its block means when longer than `side`."""
        if not self.pooled:
            return self.run.pattern(layer, visit)
        key = ("drawn", self.side, layer, visit)
        if key not in self._cache:
            if self._from_pattern:
                t, n_heads = self.run.n_tokens, self.run.patterns[(layer, visit)].shape[1]
                rows = self.run.rows(layer, visit)
                self._cache[key] = pooled_rows(rows, t, n_heads, self.side)
            else:
                q, k, hidden = self._qk((layer, visit))
                self._cache[key] = pooled_pattern(q, k, self.side, hidden)
        return self._cache[key]

    @property
    def _from_pattern(self) -> bool:
        """Whether the run's rows are its captured pattern (an adapted model's)."""
        return getattr(self.run, "source", "qk") == "pattern"

    def bos_share(self, layer: int, visit: int) -> np.ndarray:
        """Per head, the mean attention of queries 1.. on BOS: [H], without the whole pattern."""
        if not self.pooled:
            return self.run.bos_share(layer, visit)
        key = ("bos", layer, visit)
        if key not in self._cache and self._from_pattern:
            self._first_key_shares(layer, visit)
        if key not in self._cache:
            q, k, hidden = self._qk((layer, visit))
            t, n_heads = q.shape[1], q.shape[2]
            step = max(1, CHUNK_CELLS // max(1, n_heads * t))
            with torch.no_grad():
                self._cache[key] = first_key_shares(qk_rows(q, k, hidden), t, step)[0]
        return self._cache[key]

    def slot_share(self, layer: int, visit: int) -> np.ndarray:
        """Per head, the mean attention of queries 1.. on a learned sink slot (1 minus a row's
        sum): [H], without the whole pattern."""
        if not self.pooled:
            return self.run.slot_share(layer, visit)
        key = ("slot", layer, visit)
        if key not in self._cache:
            self._first_key_shares(layer, visit)
        return self._cache[key]

    def _first_key_shares(self, layer: int, visit: int) -> None:
        """Cache the BOS and sink-slot shares of (layer, visit), a chunk of queries at a time
        from the run's own rows."""
        t = self.run.n_tokens
        n_heads = max(1, int(self.run.q[(layer, visit)].shape[2])) if self.run.q else 1
        step = max(1, CHUNK_CELLS // (n_heads * t))
        with torch.no_grad():
            bos, slot = first_key_shares(self.run.rows(layer, visit), t, step)
        self._cache[("bos", layer, visit)], self._cache[("slot", layer, visit)] = bos, slot

    def structured_head(self, layer: int, visit: int) -> int:
        return int(np.argmin(self.bos_share(layer, visit)))

    def _qk(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Q, K and the layer's hidden keys of one visit."""
        if key not in self.run.q:
            raise ProbeError(f"layer {key[0]} visit {key[1]} is not executed by {self.run.model}")
        return self.run.q[key], self.run.k[key], self.run.hidden.get(key[0])


def capped(run: Any) -> DrawableRun:
    """`run` (a PromptRun) as the attention page may send it: see the module docstring."""
    n_heads = next(iter(run.q.values())).shape[2] if run.q else 1
    return DrawableRun(run, side_for(n_heads))
