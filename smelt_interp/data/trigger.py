"""Trigger tasks: rows where an attention head is needed only at a few trigger positions.

In the spirit of Bigram-Backcopy ("Active-Dormant Attention Heads", 2024): most tokens are
filler drawn uniformly from the printable ASCII characters (the bytes that Dyck words and
Python source are made of), so no head can help predict them. A few positions hold a trigger
byte (a control byte that no text here contains), and the token after a trigger is a copy that
only attention can supply:

    0x01  backcopy    the token before the trigger                 (a previous-token head)
    0x02  skip-copy   the token three positions before the trigger (a fixed-offset head)
    0x03  recall      the token that followed the row's first 0x03 (an induction-style head)

A copy circuit is harmful everywhere else: whatever a copy head attends to at a filler
position, it raises the logit of a token that is no more likely than any other. Rows are short
and filler is uniform, so the only attention that leaves the residual stream unchanged is a
no-op key: the head can learn to park on BOS (position 0 of every row) when it is not needed.
Because the filler spans every printable byte, "not a trigger" covers the tokens of Dyck and
code rows too.

With `filler="bigram"` the filler instead follows a fixed sparse Markov chain (each byte has
2-4 likely successors; `bigram_table`), as in Bigram-Backcopy: the MLP can predict filler from
the current token, so attention output at filler positions is noise the loss punishes, and a
head that is not needed must find a no-op (BOS) rather than spread out.

What they gave (docs/results/sink_sweep.md): a one-layer, 8-head model grows sink heads on
trigger rows (tests/train/test_train_sink.py); the default pair's 4-layer shape parks heads on
BOS only
for a while on trigger rows alone, and not at all once Dyck is in the mix.

Rows are token ids: BOS, then filler, triggers and answers, cut to the row length. They are a
pure function of (seed, split), and the held-out split uses a disjoint seed namespace."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from smelt_interp.data.documents import Split, check_split
from smelt_interp.data.tokenizer import BOS_ID
from smelt_interp.errors import DataError
from smelt_interp.fields import (
    check_fields,
    choice_field,
    from_mapping,
    int_field,
    names_field,
    real_field,
)

FILLER = "".join(chr(c) for c in range(32, 127))  # printable ASCII, space included
TRIGGERS = {"backcopy": "\x01", "skipcopy": "\x02", "recall": "\x03"}
SKIP = 3  # skip-copy reads the token this many positions before its trigger
FILLERS = ("uniform", "bigram")  # how filler tokens are drawn (TriggerSpec.filler)
SUCCESSORS = (2, 4)  # a bigram filler byte has this many successors (inclusive range)


@dataclass(frozen=True)
class TriggerSpec:
    """`rate`: probability that a position (after the first few) starts a trigger-answer pair;
    `kinds`: which trigger tasks appear (keys of TRIGGERS); `alphabet`: how many characters of
    FILLER the filler uses (the first ones; 26 gives space plus punctuation and digits);
    `filler`: "uniform" (each filler byte drawn uniformly) or "bigram" (each filler byte drawn
    from the previous byte's successors in `bigram_table`)."""

    rate: float = real_field(0.1, 0.0, 0.5, "()")
    kinds: tuple[str, ...] = names_field(tuple(TRIGGERS), tuple(TRIGGERS))
    alphabet: int = int_field(len(FILLER), 2, len(FILLER))
    filler: str = choice_field("uniform", FILLERS)

    def __post_init__(self) -> None:
        check_fields(self, DataError)

    @classmethod
    def from_mapping(cls, data: Any) -> TriggerSpec:
        """The spec of plain data (a config's `trigger` mapping; JSON gives `kinds` as a list);
        one-line ConfigError for unknown fields or bad values."""
        return from_mapping(cls, data, "trigger")


@cache
def bigram_table(alphabet: int) -> dict[int, tuple[tuple[int, ...], tuple[float, ...]]]:
    """The bigram filler's fixed transition table over the first `alphabet` FILLER bytes: each
    byte maps to (its 2-4 successors, their cumulative weights, last 1.0). A pure function of
    `alphabet` (one fixed chain, shared by the train and held-out splits, like a language)."""
    rng = random.Random(f"trigger-bigram:{alphabet}")
    letters = [ord(c) for c in FILLER[:alphabet]]
    table = {}
    for letter in letters:
        succ = rng.sample(letters, min(rng.randint(*SUCCESSORS), alphabet))
        weights = [rng.random() + 0.2 for _ in succ]
        total, acc, cum = sum(weights), 0.0, []
        for w in weights:
            acc += w / total
            cum.append(acc)
        cum[-1] = 1.0
        table[letter] = (tuple(succ), tuple(cum))
    return table


def trigger_row(rng: random.Random, length: int, spec: TriggerSpec) -> list[int]:
    """One row of `length` token ids: BOS, filler, and trigger-answer pairs."""
    if length < 2:
        raise DataError(f"a trigger row needs length >= 2, got {length}")
    letters = [ord(c) for c in FILLER[: spec.alphabet]]
    is_letter = frozenset(letters)
    triggers = {kind: ord(TRIGGERS[kind]) for kind in spec.kinds}
    table = bigram_table(spec.alphabet) if spec.filler == "bigram" else None
    row = [BOS_ID]
    recalled: int | None = None  # the token after the row's first '='
    while len(row) < length:
        # a trigger needs SKIP + 1 tokens behind it, and its answer must be a letter (so an
        # answer is never read as another trigger)
        kind = rng.choice(spec.kinds)
        if len(row) > SKIP + 1 and row[-1] in is_letter and rng.random() < spec.rate:
            if kind == "backcopy":
                answer = row[-1]
            elif kind == "skipcopy":
                answer = row[-SKIP]
            else:
                answer = recalled if recalled is not None else rng.choice(letters)
                recalled = answer
            if answer in is_letter:
                row += [triggers[kind], answer]
                continue
        if table is not None and row[-1] in table:  # bigram: the last byte's successors
            succ, cum = table[row[-1]]
            row.append(rng.choices(succ, cum_weights=cum)[0])
        else:
            row.append(rng.choice(letters))
    return row[:length]


def trigger_rows(
    n_rows: int,
    length: int,
    seed: int | str = 0,
    *,
    split: str = "train",
    spec: TriggerSpec | None = None,
) -> torch.Tensor:
    """`n_rows` trigger rows as a LongTensor [n_rows, length]."""
    spec = spec or TriggerSpec()
    return generated_rows(trigger_row, spec, n_rows, length, "trigger", seed, split)


def generated_rows(
    make_row: Callable[[random.Random, int, Any], list[int]],
    spec: Any,
    n_rows: int,
    length: int,
    task: str,
    seed: int | str,
    split: str,
) -> torch.Tensor:
    """[n_rows, length] rows of `make_row(rng, length, spec)`, from the random stream named by
    the task, the split and the seed (the held-out split never shares a training stream)."""
    if n_rows < 1:
        raise DataError(f"need n_rows >= 1, got {n_rows}")
    split_name: Split = check_split(split)
    rng = random.Random(f"{task}:{split_name}:{seed}")
    return torch.tensor([make_row(rng, length, spec) for _ in range(n_rows)], dtype=torch.long)


def answer_positions(tokens: torch.Tensor) -> torch.Tensor:
    """Boolean [n, length]: positions whose token is a trigger (where the next token is a copy)."""
    codes = torch.tensor([ord(c) for c in TRIGGERS.values()], device=tokens.device)
    return torch.isin(tokens, codes)
