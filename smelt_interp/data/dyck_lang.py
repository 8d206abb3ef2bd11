"""The Dyck-n language over up to four bracket pairs: a random generator of balanced words and
prefixes, and the stack-based reference solver every Dyck answer is checked against.

Words are written as brackets separated by single spaces, e.g. `( [ ] ) < >`."""

from __future__ import annotations

import random
from dataclasses import dataclass

from smelt_interp.errors import DataError

OPENERS = "([{<"
CLOSERS = ")]}>"
CLOSER_OF = dict(zip(OPENERS, CLOSERS))
OPENER_OF = dict(zip(CLOSERS, OPENERS))
MAX_PAIRS = len(OPENERS)


@dataclass(frozen=True)
class DyckSpec:
    """Controls of the generator. Lengths count brackets of the whole word (for a completion
    example: prefix plus answer); depth is the maximum number of simultaneously open brackets.
    `p_open` is the probability of opening when both opening and closing are allowed."""

    n_pairs: int = 4
    max_depth: int = 6
    min_len: int = 2
    max_len: int = 20
    p_open: float = 0.5

    def __post_init__(self) -> None:
        if not 1 <= self.n_pairs <= MAX_PAIRS:
            raise DataError(f"n_pairs must be 1..{MAX_PAIRS}, got {self.n_pairs}")
        if self.max_depth < 1:
            raise DataError(f"max_depth must be >= 1, got {self.max_depth}")
        if self.min_len < 2:
            raise DataError(f"min_len must be >= 2, got {self.min_len}")
        if self.max_len < self.min_len:
            raise DataError(f"max_len ({self.max_len}) must be >= min_len ({self.min_len})")
        if not self.lengths:
            raise DataError(
                f"no even length in [{self.min_len}, {self.max_len}]; balanced words have even length"
            )
        if not 0.0 < self.p_open < 1.0:
            raise DataError(f"p_open must be in (0, 1), got {self.p_open}")

    @property
    def lengths(self) -> list[int]:
        """The even word lengths the generator draws from (uniformly)."""
        return [n for n in range(self.min_len, self.max_len + 1) if n % 2 == 0]


def _random_walk(rng: random.Random, spec: DyckSpec, n_steps: int, end_depth: int) -> list[str]:
    """`n_steps` brackets starting at depth 0 and ending at `end_depth` open brackets, never
    deeper than spec.max_depth. Each step opens (a uniform bracket type) with probability
    p_open when both moves can still reach the end depth, else takes the only feasible move."""
    stack: list[str] = []
    out: list[str] = []
    for step in range(n_steps):
        left = n_steps - step - 1  # steps after this one
        depth = len(stack)
        can_open = depth + 1 <= spec.max_depth and abs(depth + 1 - end_depth) <= left
        can_close = depth > 0 and abs(depth - 1 - end_depth) <= left
        opening = rng.random() < spec.p_open if (can_open and can_close) else can_open
        if opening:
            bracket = OPENERS[rng.randrange(spec.n_pairs)]
            stack.append(bracket)
            out.append(bracket)
        else:
            out.append(CLOSER_OF[stack.pop()])
    return out


def random_word(rng: random.Random, spec: DyckSpec) -> str:
    """A balanced word whose length is uniform over spec.lengths."""
    return " ".join(_random_walk(rng, spec, rng.choice(spec.lengths), 0))


def random_prefix(rng: random.Random, spec: DyckSpec) -> str:
    """A prefix with at least one unclosed bracket. The whole word (prefix plus its closing
    sequence) has a length uniform over spec.lengths; the answer length is uniform over
    1..min(max_depth, length / 2)."""
    total = rng.choice(spec.lengths)
    n_open = rng.randint(1, min(spec.max_depth, total // 2))
    return " ".join(_random_walk(rng, spec, total - n_open, n_open))


def parse_brackets(text: str) -> list[str]:
    """The brackets of `text`, ignoring whitespace; any other character raises DataError."""
    if not isinstance(text, str):
        raise DataError(f"expected bracket text, got {type(text).__name__}")
    out = []
    for i, ch in enumerate(text):
        if ch.isspace():
            continue
        if ch not in CLOSER_OF and ch not in OPENER_OF:
            raise DataError(
                f"not a bracket: {ch!r} at position {i}; use ( ) [ ] {{ }} < > separated by spaces"
            )
        out.append(ch)
    return out


def open_stack(text: str) -> list[str]:
    """The openers still unclosed after `text`; a closer without its opener raises DataError."""
    stack: list[str] = []
    for i, ch in enumerate(parse_brackets(text)):
        if ch in CLOSER_OF:
            stack.append(ch)
        elif not stack:
            raise DataError(f"malformed Dyck input: {ch!r} (bracket {i + 1}) closes nothing")
        elif stack[-1] != OPENER_OF[ch]:
            raise DataError(
                f"malformed Dyck input: {ch!r} (bracket {i + 1}) does not close {stack[-1]!r}"
            )
        else:
            stack.pop()
    return stack


def closing_sequence(prefix: str) -> str:
    """The ground-truth answer: the shortest bracket sequence that balances `prefix`, space
    separated ('' when it is already balanced)."""
    return " ".join(CLOSER_OF[b] for b in reversed(open_stack(prefix)))


def normalize(text: str) -> str:
    """Canonical form: brackets separated by single spaces."""
    return " ".join(parse_brackets(text))


def is_balanced(text: str) -> bool:
    """True for a well-formed word with nothing left open."""
    try:
        return not open_stack(text)
    except DataError:
        return False
