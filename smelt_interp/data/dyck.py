"""Dyck-n data: balanced-word generation, the in-context completion task, train/held-out
datasets split by a hash of the query input, packed training rows, and model evaluation.

The text format and token spans are defined in `dyck_task`; the language and reference solver
in `dyck_lang`; greedy completion in `dyck_eval`. This module is the public face of all three."""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch

from smelt_interp.data.dyck_eval import complete, complete_many, exact_match_accuracy
from smelt_interp.data.dyck_lang import (
    CLOSERS,
    OPENERS,
    DyckSpec,
    closing_sequence,
    is_balanced,
    normalize,
    random_prefix,
    random_word,
)
from smelt_interp.data.dyck_task import (
    EXAMPLE_SEP,
    DyckExample,
    build_example,
    format_example,
    format_query,
    query_split,
)
from smelt_interp.data.split import Split, check_split
from smelt_interp.data.tokenizer import BOS_ID
from smelt_interp.errors import DataError

__all__ = [
    "OPENERS",
    "CLOSERS",
    "EXAMPLE_SEP",
    "DyckSpec",
    "DyckExample",
    "closing_sequence",
    "is_balanced",
    "normalize",
    "random_word",
    "random_prefix",
    "format_query",
    "format_example",
    "build_example",
    "query_split",
    "sample_prefix",
    "sample_example",
    "make_dataset",
    "example_lines",
    "packed_rows",
    "iter_packed_rows",
    "complete",
    "complete_many",
    "exact_match_accuracy",
]

MAX_TRIES = 10_000


def sample_prefix(rng: random.Random, spec: DyckSpec, split: Split | None = None) -> str:
    """A random unclosed prefix, from `split` when given (rejection sampling on its hash)."""
    for _ in range(MAX_TRIES):
        prefix = random_prefix(rng, spec)
        if split is None or query_split(prefix) == split:
            return prefix
    raise DataError(
        f"no {split} Dyck input found in {MAX_TRIES} draws; the input space of {spec} is too small"
    )


def sample_example(
    rng: random.Random, spec: DyckSpec, n_demos: int = 0, split: Split | None = None
) -> DyckExample:
    """A query and `n_demos` demonstrations, all drawn from `split`."""
    prefixes = [sample_prefix(rng, spec, split) for _ in range(n_demos + 1)]
    return build_example(prefixes[-1], prefixes[:-1])


def make_dataset(
    n: int,
    *,
    n_pairs: int = 4,
    max_depth: int = 6,
    min_len: int = 2,
    max_len: int = 20,
    n_demos: int = 0,
    seed: int = 0,
    split: str = "train",
) -> list[DyckExample]:
    """`n` in-context completion examples. A query input belongs to 'heldout' iff its hash
    says so (about 10%), so train and held-out sets never share an input, for any seeds."""
    if n < 0 or n_demos < 0:
        raise DataError(f"n and n_demos must be >= 0, got n={n}, n_demos={n_demos}")
    spec = DyckSpec(n_pairs, max_depth, min_len, max_len)
    rng = random.Random(seed)
    split = check_split(split)
    return [sample_example(rng, spec, n_demos, split) for _ in range(n)]


def example_lines(rng: random.Random, spec: DyckSpec, split: Split = "train") -> Iterator[str]:
    """Endless complete examples, each ending in the separator: 'Input: ... Output: ...\\n'."""
    while True:
        prefix = sample_prefix(rng, spec, split)
        yield format_example(prefix, closing_sequence(prefix)) + EXAMPLE_SEP


def _row(lines: Iterator[str], seq_len: int) -> list[int]:
    row = [BOS_ID]
    while len(row) < seq_len:
        row.extend(next(lines).encode("utf-8"))
    return row[:seq_len]


def iter_packed_rows(
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    *,
    n_pairs: int = 4,
    max_depth: int = 6,
    min_len: int = 2,
    max_len: int = 20,
    split: str = "train",
) -> Iterator[torch.Tensor]:
    """Endless LongTensor batches [batch_size, seq_len]: each row is BOS then examples packed
    until full (the last one cut off), meant for a loss on every token."""
    if batch_size < 1 or seq_len < 2:
        raise DataError(f"need batch_size >= 1 and seq_len >= 2, got {batch_size} and {seq_len}")
    spec = DyckSpec(n_pairs, max_depth, min_len, max_len)
    lines = example_lines(random.Random(seed), spec, check_split(split))
    while True:
        yield torch.tensor([_row(lines, seq_len) for _ in range(batch_size)], dtype=torch.long)


def packed_rows(n_rows: int, seq_len: int, seed: int = 0, **kwargs) -> torch.Tensor:
    """`n_rows` packed rows as one LongTensor [n_rows, seq_len] (see iter_packed_rows)."""
    return next(iter_packed_rows(n_rows, seq_len, seed, **kwargs))
