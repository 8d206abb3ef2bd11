"""Domain-tagged corpora for training and evaluation.

`Corpus` holds documents (each wholly train or held-out by a hash of its id); a
`DomainMixture` draws endless training batches [batch, seq_len] with given domain weights,
one domain per row; `heldout_batches` packs a domain's held-out documents for evaluation.
Sources and their errors live in `sources`; packing in `packing`."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from smelt_interp.data.documents import Document, check_split
from smelt_interp.data.packing import DocumentStream, encode_documents, pack_once
from smelt_interp.data.sources import load_source
from smelt_interp.errors import DataError

if TYPE_CHECKING:
    from smelt_interp.data.bpe import Tokenizer


def _check_shape(n_rows: int, seq_len: int) -> None:
    if n_rows < 1 or seq_len < 2:
        raise DataError(f"need rows >= 1 and seq_len >= 2, got {n_rows} and {seq_len}")


class Corpus:
    """An immutable collection of documents with per-domain, per-split views."""

    def __init__(self, documents: Iterable[Document]):
        self.documents: tuple[Document, ...] = tuple(documents)
        if not self.documents:
            raise DataError("empty corpus: no documents")

    @classmethod
    def from_specs(cls, specs: Sequence[str], **kwargs) -> Corpus:
        """A corpus of every `load_source(spec, **kwargs)`."""
        return cls(doc for spec in specs for doc in load_source(spec, **kwargs))

    @property
    def domains(self) -> list[str]:
        return sorted({d.domain for d in self.documents})

    def select(self, domain: str | None = None, split: str | None = None) -> list[Document]:
        """Documents of `domain` and `split` (either may be None for all), in corpus order."""
        if domain is not None and domain not in self.domains:
            raise DataError(f"unknown domain {domain!r}; this corpus has {', '.join(self.domains)}")
        if split is not None:
            check_split(split)
        return [
            d
            for d in self.documents
            if (domain is None or d.domain == domain) and (split is None or d.split == split)
        ]

    def table(self) -> list[dict]:
        """One record per document: id, domain, split, n_bytes (for bucketing losses)."""
        return [
            {"id": d.id, "domain": d.domain, "split": d.split, "n_bytes": d.n_bytes}
            for d in self.documents
        ]

    def heldout_batches(
        self, domain: str, n_rows: int, seq_len: int, tokenizer: Tokenizer | None = None
    ) -> torch.Tensor:
        """Up to `n_rows` rows [m, seq_len] packed from the domain's held-out documents,
        sorted by id, each token used once; the last row may end in PAD_ID (ignore it in the
        loss). Deterministic, so evaluations compare like with like. Bytes, or `tokenizer`'s ids."""
        _check_shape(n_rows, seq_len)
        docs = sorted(self.select(domain, "heldout"), key=lambda d: d.id)
        if not docs:
            raise DataError(f"domain {domain!r} has no held-out documents; add more data")
        return pack_once(docs, n_rows, seq_len, tokenizer)

    def encode(self, docs: Sequence[Document], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One padded row per document with its length; see packing.encode_documents."""
        return encode_documents(docs, seq_len)

    def mixture(
        self, weights: Mapping[str, float] | None = None, *, seed: int = 0
    ) -> DomainMixture:
        return DomainMixture(self, weights, seed=seed)


class DomainMixture:
    """Endless training rows from a corpus's train documents: each row picks a domain with
    probability proportional to its weight (default: equal), then continues that domain's
    shuffled document stream."""

    def __init__(
        self, corpus: Corpus, weights: Mapping[str, float] | None = None, *, seed: int = 0
    ):
        self.corpus = corpus
        weights = dict(weights) if weights is not None else {d: 1.0 for d in corpus.domains}
        for domain, w in weights.items():
            if domain not in corpus.domains:
                raise DataError(
                    f"weight for unknown domain {domain!r}; "
                    f"this corpus has {', '.join(corpus.domains)}"
                )
            if not (w >= 0 and np.isfinite(w)):
                raise DataError(
                    f"weight of domain {domain!r} must be a finite number >= 0, got {w}"
                )
        self.weights = {d: float(w) for d, w in weights.items() if w > 0}
        if not self.weights:
            raise DataError("domain weights are all zero")
        self._rng = random.Random(seed)
        self._streams: dict[str, DocumentStream] = {}
        for domain in self.weights:
            docs = corpus.select(domain, "train")
            if not docs:
                raise DataError(f"domain {domain!r} has no training documents")
            self._streams[domain] = DocumentStream(docs, random.Random(f"{seed}:{domain}"))
        self._names = list(self.weights)
        self._cum = list(np.cumsum([self.weights[d] for d in self._names]))

    def batch_with_domains(self, batch_size: int, seq_len: int) -> tuple[torch.Tensor, list[str]]:
        """A LongTensor [batch_size, seq_len] and the domain of each row."""
        _check_shape(batch_size, seq_len)
        domains = self._rng.choices(self._names, cum_weights=self._cum, k=batch_size)
        rows = np.stack([self._streams[d].row(seq_len) for d in domains])
        return torch.from_numpy(rows).long(), domains

    def batch(self, batch_size: int, seq_len: int) -> torch.Tensor:
        return self.batch_with_domains(batch_size, seq_len)[0]

    def batches(self, batch_size: int, seq_len: int) -> Iterator[torch.Tensor]:
        """Endless batches, for a trainer's loop."""
        while True:
            yield self.batch(batch_size, seq_len)
