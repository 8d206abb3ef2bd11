"""A document (a piece of text tagged with its domain) and the train / held-out split.

A split is decided by hashing a key (a document id, a Dyck input): it depends on nothing but the
key, so every call, seed and process agrees, and train and held-out sets are disjoint by
construction. A document is wholly train or wholly held-out, by its id."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from smelt_interp.errors import DataError

Split = Literal["train", "heldout"]
SPLITS: tuple[str, ...] = ("train", "heldout")
HELDOUT_FRACTION = 0.1


def stable_hash(key: str) -> int:
    """A 64-bit hash of `key` that every process agrees on (BLAKE2b; Python's hash() is salted
    per process)."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def key_fraction(key: str) -> float:
    """A stable pseudo-uniform number in [0, 1) for `key`."""
    return stable_hash(key) / 2.0**64


def split_of(key: str, heldout_fraction: float = HELDOUT_FRACTION) -> Split:
    """'heldout' for about `heldout_fraction` of keys, 'train' for the rest."""
    return "heldout" if key_fraction(key) < heldout_fraction else "train"


def check_split(split: str) -> Split:
    """Validate a split name, raising DataError with the allowed names."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; expected 'train' or 'heldout'")
    return split  # type: ignore[return-value]


@dataclass(frozen=True)
class Document:
    """`id` is stable (a relative path, `file.jsonl:12`, `arith/0/17`) and fixes the split."""

    id: str
    domain: str
    text: str

    @property
    def split(self) -> Split:
        return split_of(self.id)

    @property
    def n_bytes(self) -> int:
        """Length in tokens, not counting BOS/EOS (the tokenizer is byte-level)."""
        return len(self.text.encode("utf-8"))
