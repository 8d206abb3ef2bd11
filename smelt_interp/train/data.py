"""Training batches that are a pure function of (seed, step, rank), so a resumed run sees
exactly the batches an uninterrupted one would, and DDP ranks see different data.

A step's micro-batch is one [batch_size, seq_len] tensor (`batch_at`: each row draws a domain by
weight), or with `row_len` set a list of parts (`batch_parts`: every domain in its weight's share
of tokens, each at its own row length, "blended"). Dyck, trigger, associative-recall and
computed-recall rows are generated; the other domains come from a Corpus, packed across
documents or, with `doc_rows`, one document a row; or, with `shards` set, from prepared token
shards (train.shard_loader)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import cached_property

import torch

from smelt_interp.data import dyck
from smelt_interp.data.assoc_recall import recall_rows
from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.computed_recall import computed_rows
from smelt_interp.data.corpora import Corpus
from smelt_interp.data.documents import Document, stable_hash
from smelt_interp.data.packing import document_rows
from smelt_interp.data.prepare_sources import GENERATED_DOMAINS
from smelt_interp.data.sources import BUILTIN_SOURCES
from smelt_interp.data.tokenizer import ByteTokenizer
from smelt_interp.data.trigger import trigger_rows
from smelt_interp.errors import DataError
from smelt_interp.fields import shown
from smelt_interp.provenance import TASK_COMPUTED
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.shard_loader import Generator, ShardBatches

# domains drawn from a generator, not from a corpus
GENERATED = GENERATED_DOMAINS
DOMAINS = (*BUILTIN_SOURCES, "trigger", "assoc_recall", TASK_COMPUTED)
CORPUS_SOURCES = tuple(s for s in BUILTIN_SOURCES if s not in GENERATED)


class TrainingData:
    """Rows of in-context Dyck examples (packed, loss on every token) and trigger-task rows
    mixed with corpus rows."""

    def __init__(self, cfg: TrainConfig, rank: int = 0, world: int = 1) -> None:
        self.cfg = cfg
        self.rank = rank
        self.weights = dict(cfg.corpus.weights)
        self.shard_batches = self._shard_batches(world) if cfg.corpus.shards else None
        shard_domains = set(self.shard_batches.train) if self.shard_batches else set()
        unknown = [
            d
            for d in self.weights
            if d not in DOMAINS and d not in shard_domains and not cfg.corpus.paths
        ]
        if unknown:
            raise DataError(
                f"unknown data domain(s) {', '.join(shown(d) for d in unknown)}; use "
                f"{', '.join(DOMAINS)}, or give data_paths for the domains of your own files"
            )
        # load and validate files now, not at the first step
        held = set(self.corpus.domains) if self.corpus is not None else set()
        held |= shard_domains
        missing = [d for d, w in self.weights.items() if w > 0 and d not in (*GENERATED, *held)]
        if missing:
            raise DataError(
                f"no document of data domain(s) {', '.join(shown(d) for d in missing)} in the "
                f"corpus (it holds {', '.join(sorted(held)) or 'none'})"
            )

    def _shard_batches(self, world: int) -> ShardBatches:
        """The loader of cfg.corpus.shards: its domains by weight, generated domains mixed in (byte
        tokenizer only: they are spelled in bytes)."""
        from smelt_interp.data.shards import ShardSet

        cfg = self.cfg
        if cfg.batch.row_len or cfg.batch.doc_rows or cfg.corpus.paths:
            raise DataError("shards cannot be combined with row_len, doc_rows or data_paths")
        shards = ShardSet(cfg.corpus.shards)
        clash = [d for d, _ in shards.shards if d in GENERATED]
        if clash:  # the loader would draw the generated rows in its place
            raise DataError(
                f"{cfg.corpus.shards}: its domain {clash[0]!r} has the name of a generated task, "
                f"whose rows would replace it; prepare it again under another domain name"
            )
        tok = shards.tokenizer
        if tok.vocab_size > cfg.model.vocab_size or tok.bos_id != cfg.model.bos_token_id:
            raise DataError(
                f"{cfg.corpus.shards}: its tokenizer has {tok.vocab_size} ids and BOS "
                f"{tok.bos_id}, "
                f"the model vocab_size {cfg.model.vocab_size} and BOS {cfg.model.bos_token_id}; "
                f"set model.vocab_size={tok.vocab_size} (train --shards does)"
            )
        generated = {d: self._generator(d) for d in GENERATED if self.weights.get(d, 0) > 0}
        if generated and not isinstance(tok, ByteTokenizer):
            raise DataError(
                f"generated domains ({', '.join(generated)}) are byte rows; they mix only with "
                f"shards of the byte tokenizer, not {cfg.corpus.shards}'s BPE"
            )
        return ShardBatches(
            shards,
            self.weights,
            cfg.batch.seq_len,
            cfg.batch.size,
            world=world,
            rank=self.rank,
            seed=cfg.seed,
            generators=generated,
        )

    def _generator(self, domain: str) -> Generator:
        """Rows of a generated domain from a seed string that names no rank (the loader splits
        one micro-batch's rows between the ranks)."""

        def rows(n_rows: int, length: int, seed: str) -> torch.Tensor:
            return self._generated(domain, n_rows, length, seed)

        return rows

    def _generated(
        self, domain: str, n_rows: int, length: int, seed: int | str, split: str = "train"
    ) -> torch.Tensor:
        """`n_rows` rows of the generated domain `domain` (one of GENERATED) from `seed` and
        `split`: the one place each task's generator and spec are named. Held-out Dyck rows are
        words of the spec's task draw."""
        corpus = self.cfg.corpus
        if domain == "dyck":
            spec = corpus.dyck.task_draw() if split == "heldout" else corpus.dyck
            return dyck.packed_rows(n_rows, length, seed, spec=spec, split=split, whole=self._whole)
        make, task_spec = {
            "trigger": (trigger_rows, corpus.trigger),
            "assoc_recall": (recall_rows, corpus.assoc_recall),
            TASK_COMPUTED: (computed_rows, corpus.computed_recall),
        }[domain]
        return make(n_rows, length, seed=seed, split=split, spec=task_spec)

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer of the training tokens (the shards', else the byte tokenizer)."""
        return self.shard_batches.shards.tokenizer if self.shard_batches else ByteTokenizer()

    @cached_property
    def corpus(self) -> Corpus | None:
        """Documents of every corpus domain (code, arith, user files)."""
        if self.shard_batches is not None:
            return None
        specs = [d for d in self.weights if d in CORPUS_SOURCES and self.weights[d] > 0]
        specs += list(self.cfg.corpus.paths)
        if not specs:
            return None
        return Corpus.from_specs(specs, seed=self.cfg.seed)

    @property
    def _whole(self) -> bool:
        """Dyck rows hold whole examples only (TrainConfig.dyck_packing)."""
        return self.cfg.batch.dyck_packing == "whole"

    def _seed(self, step: int, salt: str = "") -> str:
        return f"{self.cfg.seed}:{self.rank}:{step}:{salt}"

    def row_len(self, domain: str) -> int:
        """The row length of `domain`'s training and held-out rows."""
        return self.cfg.batch.row_len.get(domain, self.cfg.batch.seq_len)

    def batch_at(self, step: int, micro: int = 0) -> torch.Tensor:
        """The [batch_size, seq_len] batch of optimizer step `step`, micro-batch `micro`: each
        row draws its domain by weight (without `row_len`; see batch_parts)."""
        cfg = self.cfg
        if self.shard_batches is not None:
            return self.shard_batches.batch(step * cfg.batch.grad_accum + micro)
        if cfg.batch.row_len:
            raise DataError("with row_len a batch has parts of several lengths; use batch_parts")
        rng = random.Random(self._seed(step, f"domains{micro}"))
        names = [d for d, w in self.weights.items() if w > 0]
        domains = rng.choices(names, weights=[self.weights[d] for d in names], k=cfg.batch.size)
        parts = [
            self._rows(d, domains.count(d), cfg.batch.seq_len, step, micro)
            for d in GENERATED
            if d in domains
        ]
        others = [d for d in domains if d not in GENERATED]
        if others:
            if cfg.batch.doc_rows:
                parts += [
                    self._rows(d, others.count(d), cfg.batch.seq_len, step, micro)
                    for d in sorted(set(others))
                ]
            else:
                assert self.corpus is not None
                counts = {d: others.count(d) for d in set(others)}
                mixture = self.corpus.mixture(
                    counts, seed=hash_seed(self._seed(step, f"mix{micro}"))
                )
                parts.append(mixture.batch(len(others), cfg.batch.seq_len))
        return torch.cat(parts)

    def batch_parts(self, step: int, micro: int = 0) -> list[torch.Tensor]:
        """The micro-batch as a list of [n, length] parts. Without `row_len`: [batch_at]. With
        it: one part per domain of positive weight, in `data` order, [n_d, row_len_d], where n_d
        rows hold about the domain's weight share of the batch_size * seq_len tokens (at least
        one row), so every step blends every domain."""
        cfg = self.cfg
        if not cfg.batch.row_len:
            return [self.batch_at(step, micro)]
        budget = cfg.batch.size * cfg.batch.seq_len
        total = sum(self.weights.values())
        parts = []
        for domain, weight in self.weights.items():
            if weight <= 0:
                continue
            length = self.row_len(domain)
            n_rows = max(1, round(budget * weight / total / length))
            parts.append(self._rows(domain, n_rows, length, step, micro))
        return parts

    def _rows(self, domain: str, n_rows: int, length: int, step: int, micro: int) -> torch.Tensor:
        """`n_rows` training rows of one domain, `length` tokens each."""
        seed = self._seed(step, f"{domain}{micro}")
        if domain in GENERATED:
            return self._generated(domain, n_rows, length, seed)
        assert self.corpus is not None
        if self.cfg.batch.doc_rows:
            return document_rows(self._train_docs[domain], n_rows, length, random.Random(seed))
        return self.corpus.mixture({domain: 1.0}, seed=hash_seed(seed)).batch(n_rows, length)

    @cached_property
    def _train_docs(self) -> dict[str, list[Document]]:
        """Each corpus domain's training documents (for one-document rows)."""
        if self.corpus is None:
            return {}
        return {d: self.corpus.select(d, "train") for d in self.corpus.domains}

    def heldout(self, domain: str, n_rows: int) -> torch.Tensor:
        """Fixed held-out rows of one domain at its row length, for per-domain evaluation."""
        length = self.row_len(domain)
        if domain in GENERATED:
            # Dyck's held-out words keep a seed string apart from the training stream's
            seed = f"heldout:{self.cfg.seed}" if domain == "dyck" else self.cfg.seed
            return self._generated(domain, n_rows, length, seed, split="heldout")
        if self.shard_batches is not None:
            return self.shard_batches.heldout(domain, n_rows)
        if self.corpus is None:
            raise DataError(f"no corpus holds domain {domain!r}")
        return self.corpus.heldout_batches(domain, n_rows, length)

    @property
    def eval_domains(self) -> list[str]:
        domains = [d for d in GENERATED if self.weights.get(d, 0) > 0]
        if self.corpus is not None:
            domains += [d for d in self.corpus.domains if self.corpus.select(d, "heldout")]
        if self.shard_batches is not None:
            domains += self.shard_batches.heldout_domains()
        return domains


def by_length(parts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`parts` with those of the same row length concatenated (first-seen order), so a training
    step runs one forward pass per row length."""
    groups: dict[int, list[torch.Tensor]] = {}
    for part in parts:
        groups.setdefault(part.shape[1], []).append(part)
    return [torch.cat(group) if len(group) > 1 else group[0] for group in groups.values()]


def hash_seed(text: str) -> int:
    """A stable 63-bit integer seed from a string."""
    return stable_hash(text) >> 1
