"""Deterministic train / held-out assignment by hashing a key (a document id, a Dyck input).

A key's split depends on nothing but the key, so every call, seed and process agrees, and
train and held-out sets are disjoint by construction."""

from __future__ import annotations

import hashlib
from typing import Literal

Split = Literal["train", "heldout"]
SPLITS: tuple[str, ...] = ("train", "heldout")
HELDOUT_FRACTION = 0.1


def key_fraction(key: str) -> float:
    """A stable pseudo-uniform number in [0, 1) for `key` (BLAKE2b, not Python's salted hash)."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def split_of(key: str, heldout_fraction: float = HELDOUT_FRACTION) -> Split:
    """'heldout' for about `heldout_fraction` of keys, 'train' for the rest."""
    return "heldout" if key_fraction(key) < heldout_fraction else "train"


def check_split(split: str) -> Split:
    """Validate a split name, raising DataError with the allowed names."""
    from smelt_interp.errors import DataError

    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; expected 'train' or 'heldout'")
    return split  # type: ignore[return-value]
