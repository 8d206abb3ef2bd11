"""A document: a piece of text tagged with its domain, assigned wholly to train or held-out
by a hash of its id."""

from __future__ import annotations

from dataclasses import dataclass

from smelt_interp.data.split import Split, split_of


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
