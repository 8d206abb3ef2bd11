"""Computed-class recall: in-context recall whose key must itself be computed by depth.

A row is BOS, then demonstrations `x y z = L ;` and, last, a query `x' y' z' = L'`, each symbol
one byte. The class of a triple is c = f2(f1(x, y), z), where f1 (symbols x symbols -> `n_mid`)
and f2 (`n_mid` x symbols -> classes) are fixed random tables, the same for every row: two
rounds of gathering tokens and looking a pair up, so two attention-then-MLP steps. Each row
draws a fresh class -> label mapping (a permutation of the label bytes), so a label can only
be read from a demonstration of the same class, and only once the class is known: a model that
retrieves before its key exists reads the wrong demonstration. The query's class is shown in at
least one demonstration.

The "shallow" key is the control: c = h(x), h a fixed balanced table from symbols to classes,
a function of one token that the embedding alone can hold (c = x up to a relabelling), so the
key is ready before the first layer and retrieval needs no depth. `consistent_labels=False`
draws every label at random, so nothing can be recalled (labels at chance).

The position sets, for a query position q of a row (q predicts token q + 1), as in
data.assoc_recall:

- *answer positions*: q holds `=` and its class occurs in an earlier demonstration;
- *first occurrences*: q holds `=` and its class occurs in no earlier demonstration;
- *demonstration answers* of an answer position q: the label positions of the earlier
  demonstrations of q's class;
- *non-answer positions*: every other query after BOS with a target in the row (PAD excluded);
- the *query* position: the last `=` of the row, where accuracy is judged.

A row of `length` tokens holds (length - 6) // 6 demonstrations (6 tokens each, after BOS and
before the query's 5); what is left over is PAD at the end. Rows are a pure function of
(seed, split); the held-out split draws from a disjoint seed namespace, and the tables from
`table_seed` alone."""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from smelt_interp.data.tokenizer import BOS_ID, PAD_ID
from smelt_interp.data.trigger import generated_rows
from smelt_interp.errors import DataError
from smelt_interp.fields import bool_field, check_fields, choice_field, from_mapping, int_field

ARROW = ord("=")
SEP = ord(";")
SYMBOLS = tuple(range(ord("a"), ord("z") + 1))  # x, y and z are lowercase letters
LABELS = tuple(range(ord("A"), ord("Z") + 1))  # labels are uppercase letters
KEYS = ("deep", "shallow")
DEMO_TOKENS = 6  # x y z = L ;
QUERY_TOKENS = 5  # x y z = L
TASK = "computed-recall"


@dataclass(frozen=True)
class ComputedRecallSpec:
    """`n_symbols`: how many letters x, y and z range over; `n_mid`: f1's range; `n_classes`:
    f2's range (and how many labels a row maps them to); `key`: "deep" (c = f2(f1(x, y), z))
    or "shallow" (c = h(x)); `table_seed`: the seed of the fixed tables f1, f2 and h;
    `consistent_labels`: False draws every label at random (the shuffled-label control)."""

    n_symbols: int = int_field(16, 2, len(SYMBOLS))
    n_mid: int = int_field(16, 2, 64)
    n_classes: int = int_field(4, 2, len(LABELS))
    key: str = choice_field("deep", KEYS)
    table_seed: int = int_field(0, 0, 2**31 - 1)
    consistent_labels: bool = bool_field(True)

    def __post_init__(self) -> None:
        check_fields(self, DataError)
        if self.n_classes > self.n_symbols:
            raise DataError(
                f"n_classes ({self.n_classes}) must be at most n_symbols ({self.n_symbols}): "
                "the shallow key maps symbols onto classes"
            )

    @classmethod
    def from_mapping(cls, data: Any) -> ComputedRecallSpec:
        """The spec of plain data (a config's `computed_recall` mapping); one-line ConfigError
        for unknown fields or bad values."""
        return from_mapping(cls, data, "computed_recall")

    @cached_property
    def tables(self) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """(f1 [n_symbols][n_symbols] -> mid, f2 [n_mid][n_symbols] -> class, h [n_symbols] ->
        class): uniform random lookups from `table_seed`, h balanced over the classes."""
        rng = random.Random(f"{TASK}:tables:{self.table_seed}")
        n = self.n_symbols
        f1 = [[rng.randrange(self.n_mid) for _ in range(n)] for _ in range(n)]
        f2 = [[rng.randrange(self.n_classes) for _ in range(n)] for _ in range(self.n_mid)]
        h = [i % self.n_classes for i in range(n)]
        rng.shuffle(h)
        return f1, f2, h

    def class_of(self, x: int, y: int, z: int) -> int:
        """The class of the triple of symbol indices (0..n_symbols - 1) under this key."""
        f1, f2, h = self.tables
        return f2[f1[x][y]][z] if self.key == "deep" else h[x]

    @cached_property
    def by_class(self) -> list[list[tuple[int, int, int]]]:
        """Every triple of symbol indices, grouped by class (a class no triple reaches is
        empty)."""
        n = self.n_symbols
        found: list[list[tuple[int, int, int]]] = [[] for _ in range(self.n_classes)]
        for x in range(n):
            for y in range(n):
                for z in range(n):
                    found[self.class_of(x, y, z)].append((x, y, z))
        return found

    @property
    def symbol_ids(self) -> tuple[int, ...]:
        return SYMBOLS[: self.n_symbols]

    @property
    def label_ids(self) -> tuple[int, ...]:
        return LABELS[: self.n_classes]


def n_demos_for(length: int) -> int:
    """How many demonstrations a row of `length` tokens holds (at least one)."""
    n = (length - 1 - QUERY_TOKENS) // DEMO_TOKENS
    if n < 1:
        raise DataError(
            f"a computed-recall row needs length >= {1 + DEMO_TOKENS + QUERY_TOKENS}, got {length}"
        )
    return n


def computed_row(rng: random.Random, length: int, spec: ComputedRecallSpec) -> list[int]:
    """One row of `length` token ids: BOS, demonstrations, the query and its label, PAD."""
    n_demos = n_demos_for(length)
    classes = [c for c, triples in enumerate(spec.by_class) if triples]
    labels = list(spec.label_ids)
    rng.shuffle(labels)  # this row's class -> label mapping
    query_class = rng.choice(classes)
    demo_classes = [rng.choice(classes) for _ in range(n_demos)]
    if query_class not in demo_classes:  # the query's class is always shown
        demo_classes[rng.randrange(n_demos)] = query_class
    row = [BOS_ID]
    for c in [*demo_classes, query_class]:
        x, y, z = rng.choice(spec.by_class[c])
        label = labels[c] if spec.consistent_labels else rng.choice(spec.label_ids)
        row += [spec.symbol_ids[x], spec.symbol_ids[y], spec.symbol_ids[z], ARROW, label, SEP]
    row = row[:-1]  # the query ends at its label
    return row + [PAD_ID] * (length - len(row))


def computed_rows(
    n_rows: int,
    length: int,
    seed: int | str = 0,
    *,
    split: str = "train",
    spec: ComputedRecallSpec | None = None,
) -> torch.Tensor:
    """`n_rows` computed-recall rows as a LongTensor [n_rows, length]."""
    spec = spec or ComputedRecallSpec()
    return generated_rows(computed_row, spec, n_rows, length, TASK, seed, split)


@dataclass(frozen=True)
class ComputedPositions:
    """The position sets of a batch of rows [b, T] (see the module docstring): `answer`,
    `first`, `non_answer` and `query` [b, T] bool over query positions; `demos` [b, T, T] bool,
    demos[r, q, k]: key k is a demonstration answer of answer position q; `classes` [b, T]: the
    class of the triple before each `=` (-1 elsewhere); `targets` [b, T]: the token each
    query predicts (the last column repeats the last token and is in no set)."""

    answer: torch.Tensor
    first: torch.Tensor
    non_answer: torch.Tensor
    query: torch.Tensor
    demos: torch.Tensor
    classes: torch.Tensor
    targets: torch.Tensor


def triple_classes(tokens: torch.Tensor, spec: ComputedRecallSpec) -> torch.Tensor:
    """[b, T]: the class of the three symbols before each `=` of `tokens` under `spec`'s key
    (-1 where the token is not `=`, or the three tokens before it are not symbols)."""
    index = torch.full((PAD_ID + 2,), -1, dtype=torch.long)
    index[torch.tensor(spec.symbol_ids)] = torch.arange(spec.n_symbols)
    f1, f2, h = (torch.tensor(t) for t in spec.tables)
    b, t = tokens.shape
    classes = torch.full((b, t), -1, dtype=torch.long)
    rows, cols = torch.nonzero((tokens == ARROW) & (torch.arange(t) >= 3)[None, :], as_tuple=True)
    xyz = torch.stack([index[tokens[rows, cols - k].clamp(max=PAD_ID + 1)] for k in (3, 2, 1)])
    ok = (xyz >= 0).all(dim=0)
    x, y, z = xyz[:, ok]
    found = f2[f1[x, y], z] if spec.key == "deep" else h[x]
    classes[rows[ok], cols[ok]] = found
    return classes


def computed_positions(tokens: torch.Tensor, spec: ComputedRecallSpec) -> ComputedPositions:
    """The position sets of `tokens` [b, T] (any rows, hand-made ones too) under `spec`."""
    if tokens.dim() != 2:
        raise DataError(
            f"computed-recall positions need a [rows, length] batch, got {tuple(tokens.shape)}"
        )
    b, t = tokens.shape
    pos = torch.arange(t)
    classes = triple_classes(tokens, spec)
    arrow = classes >= 0
    has_target = (pos < t - 1)[None, :] & torch.cat(
        [tokens[:, 1:] != PAD_ID, torch.zeros(b, 1, dtype=torch.bool)], dim=1
    )
    # earlier[r, q, i]: an `=` at i < q of the same class as the `=` at q
    earlier = (
        (classes[:, :, None] == classes[:, None, :])
        & arrow[:, :, None]
        & arrow[:, None, :]
        & (pos[None, :] < pos[:, None])[None]
    )
    seen = earlier.any(dim=-1)
    answer = arrow & seen & has_target
    first = arrow & ~seen & has_target
    non_answer = ~arrow & (pos >= 1)[None, :] & has_target
    last_arrow = torch.where(arrow, pos[None, :], -1).max(dim=1).values
    query = (pos[None, :] == last_arrow[:, None]) & has_target
    demos = torch.zeros(b, t, t, dtype=torch.bool)
    demos[:, :, 1:] = earlier[:, :, :-1]  # the `=` at i shows its label at key i + 1
    demos &= answer[:, :, None]
    targets = torch.cat([tokens[:, 1:], tokens[:, -1:]], dim=1)
    return ComputedPositions(answer, first, non_answer, query, demos, classes, targets)
