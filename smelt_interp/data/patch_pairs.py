"""Prompt pairs for patching: a clean prompt and a corrupted one of the same length that differ in
the one token the answer hangs on, with the position whose next token is scored and the answer
each prompt calls for (smelt_interp.measure.patching scores the logit difference between them).

- Dyck with a changed bracket: a held-out in-context example (BOS + demonstrations + the query's
  "Input: ... Output: ") whose innermost unclosed opener is swapped for another bracket type, so
  the first closer of the answer changes (")" -> "]") and nothing else in the prompt does;
- recall with a changed key: a held-out associative-recall row whose last answer position's
  trigger is swapped for another trigger shown earlier in the row with another successor, so the
  recalled token changes (with one trigger a row, its shown successor changes instead);
- a user's own pair: two id rows of equal length (text is encoded by the caller with the model's
  tokenizer); unequal lengths are a DataError, one line."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import torch

from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_rows
from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.dyck import (
    OPENERS,
    DyckSpec,
    build_example,
    dyck_max_len,
    normalize,
    parse_brackets,
    sample_example,
)
from smelt_interp.data.dyck_tokens import AmbiguousPrompt, encode_example
from smelt_interp.data.tokenizer import PAD_ID, ByteTokenizer
from smelt_interp.data.trigger import FILLER
from smelt_interp.errors import DataError

UNKNOWN = -1  # an answer not given: the model's own prediction stands in (measure.patching)
PAIR_KINDS = ("dyck", "recall")
DEFAULT_ROWS = 8
DYCK_WORDS = DyckSpec(n_pairs=4, max_depth=4, max_len=10)  # the dashboard's default words
MAX_DRAWS = 1_000
IDS_LEN = 32  # ids in the row of a model that reads no text


@dataclass(frozen=True)
class PromptPair:
    """`clean`, `corrupt` [n, T] ids differing only where the pair's story says; `position` [n]:
    the position whose next-token logits are scored; `clean_answer`, `corrupt_answer` [n]: the
    token each prompt calls for there (UNKNOWN where the model's prediction is to be used)."""

    clean: torch.Tensor
    corrupt: torch.Tensor
    position: torch.Tensor
    clean_answer: torch.Tensor
    corrupt_answer: torch.Tensor
    label: str = ""

    def __post_init__(self) -> None:
        if self.clean.dim() != 2 or self.clean.shape != self.corrupt.shape:
            raise DataError(
                f"a prompt pair needs two id rows of equal length; got "
                f"{tuple(self.clean.shape)} and {tuple(self.corrupt.shape)}"
            )
        n, t = self.clean.shape
        for name in ("position", "clean_answer", "corrupt_answer"):
            if tuple(getattr(self, name).shape) != (n,):
                raise DataError(f"the pair's {name} must hold one entry per row ({n})")
        if int(self.position.min()) < 0 or int(self.position.max()) >= t:
            raise DataError(f"scored positions must lie in 0..{t - 1}")

    @property
    def n_rows(self) -> int:
        return self.clean.shape[0]

    @property
    def length(self) -> int:
        return self.clean.shape[1]

    def with_answers(self, clean: torch.Tensor, corrupt: torch.Tensor) -> PromptPair:
        """The same pair with its answers given."""
        return PromptPair(self.clean, self.corrupt, self.position, clean, corrupt, self.label)


def _long(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def user_pair(
    clean: list[int],
    corrupt: list[int],
    clean_answer: int = UNKNOWN,
    corrupt_answer: int = UNKNOWN,
) -> PromptPair:
    """A user's pair of id rows, scored at the last position; one DataError line when the rows'
    lengths differ (patching swaps activations position by position)."""
    if len(clean) != len(corrupt):
        raise DataError(
            f"the clean and corrupted prompts must have equal lengths in tokens; got "
            f"{len(clean)} and {len(corrupt)}"
        )
    if not clean:
        raise DataError("the prompts of a pair are empty")
    return PromptPair(
        _long(clean)[None],
        _long(corrupt)[None],
        _long([len(clean) - 1]),
        _long([clean_answer]),
        _long([corrupt_answer]),
        "user",
    )


def ids_pair(vocab_size: int, max_len: int, seed: int = 0, length: int = IDS_LEN) -> PromptPair:
    """For a model that reads no text (a model folder without a tokenizer): a fixed row of ids
    from 1..vocab_size-1 and its twin with the id in the middle changed, scored at the last
    position on the model's own predictions (UNKNOWN answers)."""
    gen = torch.Generator().manual_seed(seed)
    length = max(2, min(length, max_len))
    row = torch.randint(1, max(2, vocab_size), (length,), generator=gen).tolist()
    twin = list(row)
    twin[length // 2] = row[length // 2] % max(1, vocab_size - 1) + 1
    pair = user_pair(row, twin)
    return PromptPair(pair.clean, pair.corrupt, pair.position, pair.clean_answer,
                      pair.corrupt_answer, "ids: one id changed")  # fmt: skip


def innermost_open(query: str) -> int:
    """Index (among the query's brackets) of the innermost unclosed opener: the bracket the
    answer's first closer closes."""
    stack: list[int] = []
    for i, ch in enumerate(parse_brackets(query)):
        if ch in OPENERS:
            stack.append(i)
        else:
            stack.pop()
    if not stack:
        raise DataError(f"Dyck input {query!r} is balanced; nothing to change")
    return stack[-1]


def changed_bracket(query: str, n_pairs: int) -> str:
    """`query` with its innermost unclosed opener swapped for the next bracket type of the
    first `n_pairs` (so the answer's first closer changes)."""
    brackets = parse_brackets(normalize(query))
    at = innermost_open(query)
    kinds = OPENERS[: max(2, n_pairs)]
    old = brackets[at]
    brackets[at] = kinds[(kinds.index(old) + 1) % len(kinds)] if old in kinds else kinds[0]
    return " ".join(brackets)


def _pair(
    clean: torch.Tensor,
    corrupt: torch.Tensor,
    position: list[int],
    answers: list[tuple[int, int]],
    label: str,
) -> PromptPair:
    """A PromptPair of rows, scored positions and (clean, corrupted) answer pairs."""
    return PromptPair(
        clean,
        corrupt,
        _long(position),
        _long([a for a, _ in answers]),
        _long([b for _, b in answers]),
        label,
    )


def _padded(rows: list[list[int]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return _long([r + [PAD_ID] * (width - len(r)) for r in rows])


def fitting(spec: DyckSpec, n_demos: int, max_len: int) -> tuple[DyckSpec, int]:
    """The words and the most demonstrations (at most `n_demos`) whose prompts fit in `max_len`
    tokens; DataError when not even a bare query does."""
    for demos, shortest in [(d, 4) for d in range(n_demos, -1, -1)] + [(0, 2)]:
        longest = min(spec.max_len, dyck_max_len(max_len, demos))
        if longest >= shortest:  # words of 4+ brackets, with fewer demonstrations if need be
            words = dataclasses.replace(
                spec,
                max_len=longest,
                min_len=min(spec.min_len, longest),
                max_depth=min(spec.max_depth, longest // 2),
            )
            return words, demos
    raise DataError(f"no Dyck prompt fits in {max_len} tokens")


def dyck_pair(
    n_rows: int = DEFAULT_ROWS,
    seed: int = 0,
    spec: DyckSpec = DYCK_WORDS,
    n_demos: int = 2,
    max_len: int | None = None,
    tokenizer: Tokenizer | None = None,
) -> PromptPair:
    """`n_rows` held-out Dyck prompts and their changed-bracket twins in `tokenizer`'s tokens
    (default bytes, BOS first), right-padded to one length, each scored at its last prompt
    position (the answer's first token). A draw whose twin the tokenizer reads with another
    length, or as more than one changed token, is drawn again. `max_len`: the longest prompt
    allowed (a model's context)."""
    rng = random.Random(f"patch-pair:dyck:{seed}")
    tokenizer = tokenizer or ByteTokenizer()
    if max_len is not None:
        spec, n_demos = fitting(spec, n_demos, max_len)
    clean, corrupt, position, answers = [], [], [], []
    unpaired = 0  # draws the tokenizer cannot pair one token apart
    for _ in range(MAX_DRAWS):
        if len(clean) == n_rows:
            break
        example = sample_example(rng, spec, n_demos, split="heldout")
        twin = build_example(changed_bracket(example.query, spec.n_pairs), example.demos)
        try:
            example, twin = encode_example(example, tokenizer), encode_example(twin, tokenizer)
        except AmbiguousPrompt:  # a token crosses the answer's boundary in this tokenizer
            unpaired += 1
            continue
        ids, twin_ids = list(example.prompt_ids), list(twin.prompt_ids)
        if max_len is not None and len(ids) > max_len:
            continue
        if len(ids) != len(twin_ids) or sum(a != b for a, b in zip(ids, twin_ids)) != 1:
            unpaired += 1
            continue
        clean.append(ids)
        corrupt.append(twin_ids)
        position.append(len(ids) - 1)
        answers.append((example.ids[example.answer_span[0]], twin.ids[twin.answer_span[0]]))
    if len(clean) < n_rows:
        why = f"no Dyck prompt of {spec} fits in {max_len} tokens"
        if unpaired:
            why = (
                f"only {len(clean)} of {n_rows} Dyck prompt pairs in {MAX_DRAWS:,} draws: "
                f"{unpaired:,} changed brackets this tokenizer does not read as one changed token"
            )
        raise DataError(why)
    return _pair(_padded(clean), _padded(corrupt), position, answers, "dyck: changed bracket")


def key_swap(row: list[int], trigger_ids: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """(position, other trigger, answer, other answer) for the row's last answer position whose
    trigger can be swapped for another trigger shown earlier with a different successor; None
    when the row has none."""
    triggers = set(trigger_ids)
    for q in range(len(row) - 2, 0, -1):
        if row[q] not in triggers:
            continue
        shown = {row[i]: row[i + 1] for i in range(1, q) if row[i] in triggers}
        if row[q] not in shown:
            continue
        answer = shown[row[q]]
        for other, successor in sorted(shown.items()):
            if other != row[q] and successor != answer:
                return q, other, answer, successor
    return None


def value_swap(row: list[int], spec: AssocRecallSpec) -> tuple[int, int, int] | None:
    """(position, answer, other answer) for a row's last answer position, where the other answer
    is another letter of the alphabet the trigger's earlier successors are changed to (for rows
    of one trigger, where no other key was shown); None when the row has no answer position."""
    triggers = set(spec.trigger_ids)
    for q in range(len(row) - 2, 0, -1):
        if row[q] in triggers and row[q] in row[1:q]:
            answer = row[row.index(row[q], 1) + 1]
            letters = [ord(c) for c in FILLER[: spec.alphabet]]
            other = (
                letters[(letters.index(answer) + 1) % len(letters)]
                if answer in letters
                else letters[0]
            )
            return q, answer, other
    return None


def recall_pair(
    n_rows: int = DEFAULT_ROWS,
    length: int = 64,
    seed: int = 0,
    spec: AssocRecallSpec | None = None,
) -> PromptPair:
    """`n_rows` held-out recall rows of `length` and their changed-key twins: at the last answer
    position whose key can change, the trigger is swapped for another one shown earlier with a
    different successor; scored there (clean answer: the first trigger's successor, corrupted:
    the other's). Where a row shows one trigger only (a one-trigger spec), the value changes
    instead: every earlier successor of the trigger becomes another letter (value_swap). Tokens
    after the scored position cannot affect it."""
    spec = spec or AssocRecallSpec()
    rows = recall_rows(4 * n_rows + 16, length, seed, split="heldout", spec=spec)
    clean, corrupt, position, answers, changed = [], [], [], [], set()
    for row in rows.tolist():
        twin = list(row)
        swap = key_swap(row, spec.trigger_ids)
        if swap is not None:
            q, other, answer, other_answer = swap
            twin[q] = other
            changed.add("key")
        else:  # one trigger a row: what it recalls changes instead
            found = value_swap(row, spec)
            if found is None:
                continue
            q, answer, other_answer = found
            changed.add("value")
            twin = [
                other_answer if i > 0 and row[i - 1] == row[q] and i <= q else t
                for i, t in enumerate(row)
            ]
        clean.append(row)
        corrupt.append(twin)
        position.append(q)
        answers.append((answer, other_answer))
        if len(clean) == n_rows:
            break
    if len(clean) < n_rows:
        raise DataError(
            f"fewer than {n_rows} recall rows of length {length} hold a key that can change; "
            f"use longer rows or a spec with more triggers"
        )
    label = "recall: changed " + " or ".join(sorted(changed))
    return _pair(_long(clean), _long(corrupt), position, answers, label)
