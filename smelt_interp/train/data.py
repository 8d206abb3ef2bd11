"""Training batches that are a pure function of (seed, step, rank), so a resumed run sees
exactly the batches an uninterrupted one would, and DDP ranks see different data."""

from __future__ import annotations

import random
from functools import cached_property

import torch

from smelt_interp.data import dyck
from smelt_interp.data.corpora import Corpus
from smelt_interp.data.documents import stable_hash
from smelt_interp.data.sources import BUILTIN_SOURCES
from smelt_interp.errors import DataError
from smelt_interp.train.config import TrainConfig

CORPUS_SOURCES = tuple(s for s in BUILTIN_SOURCES if s != "dyck")  # Dyck rows are packed apart


class TrainingData:
    """Rows of in-context Dyck examples (packed, loss on every token) mixed with corpus rows."""

    def __init__(self, cfg: TrainConfig, rank: int = 0) -> None:
        self.cfg = cfg
        self.rank = rank
        self.spec = dyck.DyckSpec(**cfg.dyck)
        self.weights = dict(cfg.data)
        unknown = [
            d
            for d in self.weights
            if d not in BUILTIN_SOURCES and d != "text" and not cfg.data_paths
        ]
        if unknown:
            raise DataError(
                f"unknown data domain(s) {', '.join(unknown)}; use "
                f"{', '.join(BUILTIN_SOURCES)} or give data_paths"
            )
        _ = self.corpus  # load and validate files now, not at the first step

    @cached_property
    def corpus(self) -> Corpus | None:
        """Documents of every non-Dyck domain (code, arith, user files)."""
        specs = [d for d in self.weights if d in CORPUS_SOURCES and self.weights[d] > 0]
        specs += list(self.cfg.data_paths)
        if not specs:
            return None
        return Corpus.from_specs(specs, seed=self.cfg.seed)

    def _seed(self, step: int, salt: str = "") -> str:
        return f"{self.cfg.seed}:{self.rank}:{step}:{salt}"

    def batch_at(self, step: int, micro: int = 0) -> torch.Tensor:
        """The [batch_size, seq_len] batch of optimizer step `step`, micro-batch `micro`."""
        cfg = self.cfg
        rng = random.Random(self._seed(step, f"domains{micro}"))
        names = [d for d, w in self.weights.items() if w > 0]
        domains = rng.choices(names, weights=[self.weights[d] for d in names], k=cfg.batch_size)
        rows = torch.empty(cfg.batch_size, cfg.seq_len, dtype=torch.long)
        n_dyck = domains.count("dyck")
        if n_dyck:
            rows[:n_dyck] = dyck.packed_rows(
                n_dyck, cfg.seq_len, seed=self._seed(step, f"dyck{micro}"), **cfg.dyck
            )
        others = [d for d in domains if d != "dyck"]
        if others:
            assert self.corpus is not None
            counts = {d: others.count(d) for d in set(others)}
            mixture = self.corpus.mixture(counts, seed=hash_seed(self._seed(step, f"mix{micro}")))
            rows[n_dyck:] = mixture.batch(len(others), cfg.seq_len)
        return rows

    def heldout(self, domain: str, n_rows: int) -> torch.Tensor:
        """Fixed held-out rows of one domain, for per-domain evaluation losses."""
        if domain == "dyck":
            return dyck.packed_rows(
                n_rows,
                self.cfg.seq_len,
                seed=f"heldout:{self.cfg.seed}",
                split="heldout",
                **self.cfg.dyck,
            )
        if self.corpus is None:
            raise DataError(f"no corpus holds domain {domain!r}")
        return self.corpus.heldout_batches(domain, n_rows, self.cfg.seq_len)

    @property
    def eval_domains(self) -> list[str]:
        domains = ["dyck"] if self.weights.get("dyck", 0) > 0 else []
        if self.corpus is not None:
            domains += [d for d in self.corpus.domains if self.corpus.select(d, "heldout")]
        return domains


def hash_seed(text: str) -> int:
    """A stable 63-bit integer seed from a string."""
    return stable_hash(text) >> 1
