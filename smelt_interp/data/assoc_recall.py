"""In-context associative recall: the task where an attention sink and induction-style retrieval
grow together at tiny scale (Bietti et al. 2023, "Birth of a Transformer", with a BOS token as
in Guo et al. 2024, "Active-Dormant Attention Heads").

A row is BOS, then filler from a fixed sparse bigram chain (data.trigger.bigram_table: the MLP
can predict it from the current byte, so attention at filler positions is noise the loss
punishes, and an idle head must find a no-op key: BOS). At about `trigger_share` of positions a
trigger byte appears (one of the row's `n_triggers` control bytes: the same bytes in every row,
or drawn per row from a pool of `trigger_pool`), and the token after it is that
trigger's successor in this row: drawn once per row, at the trigger's first occurrence, and
repeated after every later occurrence. Only attention can recall it, from the position after an
earlier occurrence. With `backcopy_share` > 0, backcopy triggers (the token after them copies
the token before them, as in Bigram-Backcopy) are mixed in as well.

The position sets every measure shares (the probe, the trainer's evaluation and the tests),
for a query position q of a row (the query predicts token q + 1):

- *answer positions*: q holds a trigger that occurred earlier in the row, and q + 1 is in the
  row: the successor it predicts has been shown;
- *first occurrences*: q holds a trigger's first occurrence (q + 1 in the row): unpredictable,
  scored apart;
- *demonstration answers* of an answer position q: the positions i + 1 of that trigger's
  earlier occurrences i < q (the successors shown before q);
- *non-answer positions*: every other query after BOS that has a target in the row,
  1 <= q < length - 1, and holds no trigger.

The last position predicts nothing in the row, so it is in no set (a trigger there included).

Rows are a pure function of (seed, split); the held-out split draws from a disjoint seed
namespace. `repeat_successor=False` is the control: every occurrence draws a fresh successor,
so nothing can be recalled."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from smelt_interp.data.tokenizer import BOS_ID
from smelt_interp.data.trigger import FILLER, TRIGGERS, bigram_table, generated_rows
from smelt_interp.errors import DataError
from smelt_interp.fields import bool_field, check_fields, from_mapping, int_field, real_field

FIRST_TRIGGER = 0x10  # recall triggers are the control bytes from 0x10 on (see trigger_ids)
MAX_TRIGGERS = 8
BACKCOPY = ord(TRIGGERS["backcopy"])  # 0x01, as in data.trigger


@dataclass(frozen=True)
class AssocRecallSpec:
    """`n_triggers`: how many trigger bytes a row uses; `trigger_pool`: how many bytes a row
    draws its triggers from (0: exactly `n_triggers`, the same bytes in every row);
    `trigger_share`: the expected fraction of a row's positions that hold a recall trigger;
    `backcopy_share`: the same for backcopy triggers (0: none); `alphabet`: how many FILLER
    bytes the filler and the successors use; `repeat_successor`: False draws a fresh successor
    at every occurrence (the control).

    Why a pool: with one fixed trigger byte, every row's trigger positions hold the same token,
    a second key of constant content beside BOS, and an idle head can park there instead. A
    pool takes away the one byte shared by every row; heads still learn to park on whichever
    byte the row uses (docs/results/recall_sweep.md), so it does not leave BOS alone."""

    n_triggers: int = int_field(3, 1, MAX_TRIGGERS)
    trigger_pool: int = int_field(0, 0, MAX_TRIGGERS)
    trigger_share: float = real_field(0.2, 0.0, 0.45, "(]")
    backcopy_share: float = real_field(0.0, 0.0, 0.2, "[]")
    alphabet: int = int_field(26, 2, len(FILLER))
    repeat_successor: bool = bool_field(True)

    def __post_init__(self) -> None:
        check_fields(self, DataError)
        if self.trigger_pool and self.trigger_pool < self.n_triggers:
            raise DataError(
                f"trigger_pool ({self.trigger_pool}) must be 0 or at least "
                f"n_triggers ({self.n_triggers})"
            )

    @classmethod
    def from_mapping(cls, data: Any) -> AssocRecallSpec:
        """The spec of plain data (a config's `assoc_recall` mapping); one-line ConfigError for
        unknown fields or bad values."""
        return from_mapping(cls, data, "assoc_recall")

    @property
    def trigger_ids(self) -> tuple[int, ...]:
        """Every byte a row may use as a recall trigger (the pool, or the row's own triggers)."""
        return tuple(range(FIRST_TRIGGER, FIRST_TRIGGER + (self.trigger_pool or self.n_triggers)))


def recall_row(rng: random.Random, length: int, spec: AssocRecallSpec) -> list[int]:
    """One row of `length` token ids: BOS, bigram filler, and trigger-successor pairs."""
    if length < 2:
        raise DataError(f"an associative-recall row needs length >= 2, got {length}")
    letters = [ord(c) for c in FILLER[: spec.alphabet]]
    table = bigram_table(spec.alphabet)
    # A pair (trigger, successor) is 2 tokens and a filler step 1, so starting a pair with
    # probability p gives trigger positions a share p / (1 + p) of the row: p = s / (1 - s).
    share = spec.trigger_share + spec.backcopy_share
    p_pair = share / (1.0 - share)
    p_backcopy = spec.backcopy_share / share
    triggers = spec.trigger_ids
    if len(triggers) > spec.n_triggers:  # drawn only with a pool, so fixed triggers' rows keep
        triggers = tuple(rng.sample(triggers, spec.n_triggers))  # their random stream
    successor: dict[int, int] = {}
    row = [BOS_ID, rng.choice(letters)]
    while len(row) < length:
        if row[-1] in table and rng.random() < p_pair:
            if rng.random() < p_backcopy:
                row += [BACKCOPY, row[-1]]
                continue
            trigger = rng.choice(triggers)
            if trigger not in successor or not spec.repeat_successor:
                successor[trigger] = rng.choice(letters)
            row += [trigger, successor[trigger]]
            continue
        succ, cum = table[row[-1]]
        row.append(rng.choices(succ, cum_weights=cum)[0])
    return row[:length]


def recall_rows(
    n_rows: int,
    length: int,
    seed: int | str = 0,
    *,
    split: str = "train",
    spec: AssocRecallSpec | None = None,
) -> torch.Tensor:
    """`n_rows` associative-recall rows as a LongTensor [n_rows, length]."""
    spec = spec or AssocRecallSpec()
    return generated_rows(recall_row, spec, n_rows, length, "assoc-recall", seed, split)


@dataclass(frozen=True)
class RecallPositions:
    """The position sets of a batch of rows [b, T] (see the module docstring): `answer`,
    `first` and `non_answer` [b, T] bool over query positions; `demos` [b, T, T] bool,
    demos[r, q, k]: key k is a demonstration answer of answer position q (rows of positions
    that are not answer positions are all False); `targets` [b, T]: the token each query
    predicts (tokens shifted left; the last column repeats the last token and is never in a
    set)."""

    answer: torch.Tensor
    first: torch.Tensor
    non_answer: torch.Tensor
    demos: torch.Tensor
    targets: torch.Tensor


def recall_positions(tokens: torch.Tensor, trigger_ids: tuple[int, ...]) -> RecallPositions:
    """The position sets of `tokens` [b, T] (any rows, hand-made ones too) for the recall
    triggers `trigger_ids`; backcopy triggers (and any other trigger byte of data.trigger) are
    left out of the non-answer positions."""
    if tokens.dim() != 2:
        raise DataError(f"recall positions need a [rows, length] batch, got {tuple(tokens.shape)}")
    b, t = tokens.shape
    device = tokens.device
    ids = torch.tensor(trigger_ids, dtype=tokens.dtype, device=device)
    is_trigger = torch.isin(tokens, ids)
    pos = torch.arange(t, device=device)
    # earlier[r, q, i]: position i < q holds the same recall trigger as q
    earlier = (
        (tokens[:, :, None] == tokens[:, None, :])
        & is_trigger[:, :, None]
        & (pos[None, :] < pos[:, None])[None]
    )
    has_target = (pos < t - 1)[None, :]
    seen = earlier.any(dim=-1)
    answer = is_trigger & seen & has_target
    first = is_trigger & ~seen & has_target
    other_triggers = torch.isin(
        tokens, torch.tensor([ord(c) for c in TRIGGERS.values()], device=device)
    )
    non_answer = ~is_trigger & ~other_triggers & (pos >= 1)[None, :] & has_target
    demos = torch.zeros(b, t, t, dtype=torch.bool, device=device)
    demos[:, :, 1:] = earlier[:, :, :-1]  # occurrence i shows its successor at key i + 1
    demos &= answer[:, :, None]
    targets = torch.cat([tokens[:, 1:], tokens[:, -1:]], dim=1)
    return RecallPositions(answer, first, non_answer, demos, targets)
