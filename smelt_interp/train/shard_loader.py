"""Training rows from prepared token shards (data.shards): memory-mapped, every row led by BOS
(data.shards.row_plan), a weighted mixture over domains, each data-parallel rank its own rows.

Global micro-batch `u` (= step * grad_accum + micro) holds G = batch_size * world rows. Each
domain's share of them is fixed by its weight with no randomness (`domain_counts`: a domain's
cumulative row count after u micro-batches is floor(u * G * p), the heaviest domain taking the
rest), so how far each domain has read is a closed-form function of u: a resumed run reads
exactly the rows an uninterrupted one would, with no loader state to save. Within a domain, rows
are read in a fresh seeded permutation per epoch. The G rows are shuffled by a seed of u and
rank r takes rows r, r + world, ... (OLMo-core's `indices[rank::world]`), so the ranks read
disjoint rows that together are what one process with batch_size * world rows reads.

Generated domains (Dyck, trigger, recall) can be mixed in through `generators`: each builds the
domain's rows of a micro-batch from a seed string, and the ranks split them the same way."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import lru_cache

import numpy as np
import torch

from smelt_interp.data.documents import stable_hash
from smelt_interp.data.shards import DomainRows, ShardSet, heldout_rows
from smelt_interp.errors import DataError

# (n_rows, row_len, seed) -> LongTensor [n_rows, row_len]
Generator = Callable[[int, int, str], torch.Tensor]


def domain_counts(weights: np.ndarray, rows_per_batch: int, u: int) -> np.ndarray:
    """Rows of each domain in micro-batch `u`: cumulative floor(u * G * p) for every domain but
    the heaviest, which takes the rest of the G rows. Pure in u, and never negative when the
    heaviest domain's share covers the others' rounding (checked by `ShardBatches`)."""
    p = weights / weights.sum()
    heavy = int(np.argmax(p))
    before = np.floor(u * rows_per_batch * p).astype(np.int64)
    after = np.floor((u + 1) * rows_per_batch * p).astype(np.int64)
    counts = after - before
    counts[heavy] = 0
    counts[heavy] = rows_per_batch - counts.sum()
    return counts


def rows_before(weights: np.ndarray, rows_per_batch: int, u: int) -> np.ndarray:
    """How many rows each domain has read before micro-batch `u` (the sum of domain_counts)."""
    p = weights / weights.sum()
    heavy = int(np.argmax(p))
    before = np.floor(u * rows_per_batch * p).astype(np.int64)
    before[heavy] = 0
    before[heavy] = u * rows_per_batch - before.sum()
    return before


class ShardBatches:
    """This rank's [batch_size, row_len] rows of each global micro-batch (see the module
    docstring), and fixed held-out rows per domain."""

    def __init__(
        self,
        shards: ShardSet,
        weights: Mapping[str, float],
        row_len: int,
        batch_size: int,
        *,
        world: int = 1,
        rank: int = 0,
        seed: int = 0,
        generators: Mapping[str, Generator] | None = None,
    ):
        generators = dict(generators or {})
        if not 0 <= rank < world:
            raise DataError(f"rank {rank} outside a world of {world}")
        self.shards = shards
        self.pad_id = shards.tokenizer.pad_id
        self.row_len, self.batch_size, self.world, self.rank, self.seed = (
            row_len,
            batch_size,
            world,
            rank,
            seed,
        )
        self.names = [d for d, w in weights.items() if w > 0]
        if not self.names:
            raise DataError("every domain weight is zero")
        self.generators = {d: generators[d] for d in self.names if d in generators}
        self.train: dict[str, DomainRows] = {}
        for d in self.names:
            if d in self.generators:
                continue
            if not shards.select(d, "train"):
                raise DataError(
                    f"no training shards of domain {d!r} in {shards.folder} "
                    f"(it holds {', '.join(shards.domains()) or 'none'})"
                )
            self.train[d] = DomainRows(shards.select(d, "train"), row_len, self.pad_id)
            if len(self.train[d]) == 0:
                raise DataError(f"domain {d!r} has no training rows")
        self.weights = np.array([float(weights[d]) for d in self.names])
        self.rows_per_batch = batch_size * world
        p = self.weights / self.weights.sum()
        if self.rows_per_batch * p.max() < len(self.names) - 1:
            raise DataError(
                f"{self.rows_per_batch} rows a micro-batch are too few to mix "
                f"{len(self.names)} domains by these weights; raise batch_size"
            )

    @staticmethod
    @lru_cache(maxsize=8)
    def _permutation(key: int, n: int) -> np.ndarray:
        return np.random.default_rng(key).permutation(n)

    def _domain_rows(self, d: str, first: int, count: int) -> np.ndarray:
        """Rows `first`, ..., `first + count - 1` of domain d's endless epoch-shuffled order."""
        rows = self.train[d]
        n = len(rows)
        cursor = np.arange(first, first + count)
        out = np.empty(count, dtype=np.int64)
        for epoch in np.unique(cursor // n):
            sel = cursor // n == epoch
            perm = self._permutation(stable_hash(f"{self.seed}:{d}:{int(epoch)}") >> 1, n)
            out[sel] = perm[cursor[sel] % n]
        return out

    def batch(self, u: int) -> torch.Tensor:
        """This rank's rows of global micro-batch `u`, a LongTensor [batch_size, row_len]."""
        counts = domain_counts(self.weights, self.rows_per_batch, u)
        first = rows_before(self.weights, self.rows_per_batch, u)
        slots = [(i, j) for i, c in enumerate(counts) for j in range(int(c))]
        order = np.random.default_rng([self.seed, u]).permutation(len(slots))
        mine = [slots[k] for k in order[self.rank :: self.world]]
        out = np.empty((len(mine), self.row_len), dtype=np.int64)
        for i, d in enumerate(self.names):
            at = [k for k, (di, _) in enumerate(mine) if di == i]
            if not at:
                continue
            js = np.array([mine[k][1] for k in at])
            if d in self.generators:
                rows = self.generators[d](int(counts[i]), self.row_len, f"{self.seed}:{u}:{d}")
                out[at] = rows.numpy()[js]
            else:
                out[at] = self.train[d].rows(
                    self._domain_rows(d, int(first[i]), int(counts[i]))[js]
                )
        return torch.from_numpy(out)

    def heldout_domains(self) -> list[str]:
        return [d for d in self.shards.domains("heldout") if d in self.train]

    def heldout(self, domain: str, n_rows: int) -> torch.Tensor:
        """The first `n_rows` rows of the domain's held-out shards, in order (deterministic)."""
        return heldout_rows(self.shards, domain, self.row_len, n_rows)

    def epochs(self, u: int) -> dict[str, float]:
        """How many passes over each shard domain's training rows micro-batches 0..u-1 made."""
        first = rows_before(self.weights, self.rows_per_batch, u)
        return {
            d: float(first[i]) / len(self.train[d])
            for i, d in enumerate(self.names)
            if d in self.train and not math.isnan(first[i])
        }
