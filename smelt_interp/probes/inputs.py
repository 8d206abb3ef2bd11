"""The inputs probes run on: right-padded token batches from `--data` (dyck, code, arith or a
PATH of text/JSONL, via smelt_interp.data) and in-context Dyck prompts with their answer spans."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from smelt_interp.data.corpora import Corpus, load_source
from smelt_interp.data.dyck import DyckExample, make_dataset
from smelt_interp.data.packing import pack_once
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.errors import DataError, ProbeError

BUILTIN = ("dyck", "code", "arith")
DYCK_MAX_LEN = 20  # brackets per word (prefix + answer), the data module's default
_EXAMPLE_OVERHEAD = 15  # bytes of "Input: ", " Output: ", separator around 2W - 2 bracket bytes


def lengths_of(tokens: torch.Tensor) -> torch.Tensor:
    """Valid length of each right-padded row: the position of its first PAD (or the width)."""
    is_pad = tokens == PAD_ID
    first = torch.where(is_pad.any(dim=1), is_pad.int().argmax(dim=1), tokens.shape[1])
    return first.long()


def data_batch(
    spec: str, n_seqs: int, seq_len: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [n, seq_len], lengths [n]) packed from `spec`: a builtin source's held-out
    documents (never seen in training) or every document under a PATH. Rows start with BOS;
    only the last may be right-padded."""
    if n_seqs < 1 or seq_len < 2:
        raise DataError(f"need --n-seqs >= 1 and --seq-len >= 2, got {n_seqs} and {seq_len}")
    wanted = n_seqs * seq_len
    if spec in BUILTIN:
        # about 10% of documents are held out; load enough that they fill the batch
        docs = load_source(
            spec, seed=seed, n_docs=max(200, wanted // 10), max_bytes=max(2_000_000, 20 * wanted)
        )
        tokens = Corpus(docs).heldout_batches(spec, n_seqs, seq_len)
    else:
        docs = load_source(spec, seed=seed)
        tokens = pack_once(docs, n_seqs, seq_len)
    return tokens, lengths_of(tokens)


def dyck_max_len(max_seq_len: int, n_demos: int) -> int:
    """The longest Dyck word (in brackets, even) such that n_demos demonstrations plus a query
    surely fit in max_seq_len tokens; at most DYCK_MAX_LEN."""
    per_example = (max_seq_len - 1) // (n_demos + 1)
    longest = min(DYCK_MAX_LEN, (per_example - _EXAMPLE_OVERHEAD) // 2)
    return longest - longest % 2


def dyck_prompts(
    n_per_count: int,
    demos: Sequence[int],
    max_seq_len: int,
    seed: int = 0,
    max_len: int | None = None,
) -> list[DyckExample]:
    """`n_per_count` held-out in-context examples for each demonstration count in `demos`,
    with words short enough to fit `max_seq_len`."""
    examples: list[DyckExample] = []
    for n_demos in demos:
        longest = dyck_max_len(max_seq_len, n_demos) if max_len is None else max_len
        if longest < 2:
            raise ProbeError(
                f"{n_demos} Dyck demonstrations do not fit the model's max_seq_len "
                f"{max_seq_len}; use fewer with --demos"
            )
        examples += make_dataset(
            n_per_count,
            n_demos=n_demos,
            max_len=longest,
            max_depth=min(6, longest // 2),
            seed=seed + 1000 * n_demos,
            split="heldout",
        )
    return examples


def dyck_batch(examples: Sequence[DyckExample]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [n, longest] and lengths [n] of the full example texts."""
    if not examples:
        raise DataError("no Dyck examples")
    lengths = torch.tensor([len(ex.ids) for ex in examples], dtype=torch.long)
    tokens = torch.full((len(examples), int(lengths.max())), PAD_ID, dtype=torch.long)
    for row, ex in enumerate(examples):
        tokens[row, : len(ex.ids)] = torch.tensor(ex.ids, dtype=torch.long)
    return tokens, lengths


@dataclass
class ProbeInputs:
    """What the command line asked to probe on, built lazily and shared by all models."""

    data: str = "dyck"
    n_seqs: int = 16
    seq_len: int = 256
    seed: int = 0
    demos: tuple[int, ...] = (0, 1, 2, 4)
    max_seq_len: int = 512
    _cache: dict = field(default_factory=dict, repr=False)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if "batch" not in self._cache:
            self._cache["batch"] = data_batch(self.data, self.n_seqs, self.seq_len, self.seed)
        return self._cache["batch"]

    def dyck_examples(self) -> list[DyckExample]:
        if "dyck" not in self._cache:
            self._cache["dyck"] = dyck_prompts(self.n_seqs, self.demos, self.max_seq_len, self.seed)
        return self._cache["dyck"]
