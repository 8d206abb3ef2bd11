"""Dyck-n data: the language (balanced words over up to four bracket pairs, a random generator
and the stack-based reference solver every answer is checked against), the in-context completion
task in BIG-Bench `dyck_languages` text form with the exact token spans the probes read,
datasets split train / held-out by a hash of the query input, and the two named held-out draws
(validation for choosing, test for reporting) in data.dyck_draws. Scoring a model's answers
lives in measure.dyck_score.

Format (fixed here, used everywhere):

    one example     "Input: ( [ { } Output: ] )"      brackets separated by single spaces
    separator       "\\n" after every complete example (demonstrations, packed training rows)
    prompt          demonstrations, each followed by "\\n", then "Input: <query> Output: "
                    (with the trailing space), so the answer's first byte is the next token
    full text       prompt + answer (no trailing newline)
    token ids       [BOS] + UTF-8 bytes of the full text

The model's answer is what it writes after the final "Output: " up to a newline or EOS."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from smelt_interp.data.documents import Split, check_split, split_of
from smelt_interp.data.packing import pack_pieces, pack_whole
from smelt_interp.data.tokenizer import PAD_ID, ByteTokenizer
from smelt_interp.errors import DataError
from smelt_interp.fields import check_fields, from_mapping, int_field, real_field

OPENERS = "([{<"
CLOSERS = ")]}>"
CLOSER_OF = dict(zip(OPENERS, CLOSERS))
OPENER_OF = dict(zip(CLOSERS, OPENERS))
MAX_PAIRS = len(OPENERS)
EXAMPLE_SEP = "\n"
DEFAULT_MAX_LEN = 20  # brackets per word (prefix + answer) unless a caller asks for others
MAX_TRIES = 10_000
# A task's words are uniform random walks: open and close equally likely wherever both are
# allowed. A training spec may bias this (more opening gives deeper words); held-out words
# reset it (DyckSpec.task_draw), so a run is scored on the words a task poses.
TASK_P_OPEN = 0.5
MAX_WORD = 1 << 16  # brackets or nesting depth of a word: far above any context a model has
# Nesting-depth ranges that accuracy is reported by: a third of BIG-Bench `dyck_languages` words
# nest 10 deep or more (up to about 24), so depth, not length, is where a model's misses show.
# 1-8 is what a model trained on shallow words sees; 25+ is deeper than real tasks go.
DEPTH_BUCKETS: tuple[tuple[int, int | None], ...] = (
    (1, 8),
    (9, 15),
    (16, 24),
    (25, None),
)
_TOKENIZER = ByteTokenizer()

Demo = str | tuple[str, str]  # a prefix, or a (prefix, answer) pair


# ----- the language -----------------------------------------------------------------------
@dataclass(frozen=True)
class DyckSpec:
    """Controls of the generator. Lengths count brackets of the whole word (for a completion
    example: prefix plus answer); depth is the maximum number of simultaneously open brackets.
    `p_open` is the probability of opening when both opening and closing are allowed."""

    n_pairs: int = int_field(4, 1, MAX_PAIRS)
    max_depth: int = int_field(6, 1, MAX_WORD)
    min_len: int = int_field(2, 2, MAX_WORD)
    max_len: int = int_field(DEFAULT_MAX_LEN, 2, MAX_WORD)
    p_open: float = real_field(TASK_P_OPEN, 0.0, 1.0, "()")

    def __post_init__(self) -> None:
        check_fields(self, DataError)
        if self.max_len < self.min_len:
            raise DataError(f"max_len ({self.max_len}) must be >= min_len ({self.min_len})")
        if not self.lengths:
            raise DataError(
                f"no even length in [{self.min_len}, {self.max_len}]; "
                f"balanced words have even length"
            )

    @classmethod
    def from_mapping(cls, data: Any) -> DyckSpec:
        """The spec of plain data (a config's or checkpoint's `dyck` mapping); one-line
        ConfigError for unknown fields or bad values."""
        return from_mapping(cls, data, "dyck")

    def task_draw(self) -> DyckSpec:
        """This spec's words as a task poses them: its lengths and depth limit, with the
        training bias `p_open` reset to TASK_P_OPEN. Held-out words are drawn from this."""
        return dataclasses.replace(self, p_open=TASK_P_OPEN)

    @property
    def lengths(self) -> list[int]:
        """The even word lengths the generator draws from (uniformly)."""
        return [n for n in range(self.min_len, self.max_len + 1) if n % 2 == 0]


# Words as real completion tasks draw them: BIG-Bench `dyck_languages` words run to about 100
# brackets and nest up to about 24 deep. A random prefix of this spec nests 1-8 deep 39% of the
# time, 9-15 34% and 16-24 27%. The default pair is scored on held-out words of this spec (it
# trains on deeper ones, train.presets); they are also a training run's words unless its config
# says otherwise, and the downstream comparison's prompts.
TASK_DYCK = DyckSpec(n_pairs=4, max_depth=24, min_len=2, max_len=100)


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
        if ch not in OPENERS and ch not in CLOSERS:
            raise DataError(
                f"not a bracket: {ch!r} at position {i}; use ( ) [ ] {{ }} < > separated by spaces"
            )
        out.append(ch)
    return out


def open_stack(text: str) -> list[str]:
    """The openers still unclosed after `text`; a closer without its opener raises DataError."""
    stack: list[str] = []
    for i, ch in enumerate(parse_brackets(text)):
        if ch in OPENERS:
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


def nesting_depth(text: str) -> int:
    """The most brackets open at once in bracket `text` (a prefix or a whole word)."""
    depth = deepest = 0
    for ch in parse_brackets(text):
        depth += 1 if ch in OPENERS else -1
        deepest = max(deepest, depth)
    return deepest


def depth_bucket(depth: int) -> tuple[int, int | None]:
    """The DEPTH_BUCKETS range (low, high; high None for open-ended) that holds `depth`."""
    for low, high in DEPTH_BUCKETS:
        if depth >= low and (high is None or depth <= high):
            return low, high
    raise DataError(f"nesting depth must be >= 1, got {depth}")


def bucket_label(bucket: tuple[int, int | None]) -> str:
    """'6-10' for (6, 10), '31+' for (31, None)."""
    low, high = bucket
    return f"{low}+" if high is None else f"{low}-{high}"


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


# ----- the completion task ------------------------------------------------------------------
def format_query(prefix: str) -> str:
    """'Input: <prefix> Output: ' — the text the answer follows."""
    return f"Input: {prefix} Output: "


def format_example(prefix: str, answer: str) -> str:
    """One complete example, without its separator."""
    return format_query(prefix) + answer


def query_split(prefix: str) -> Split:
    """The split a query input belongs to, by hash of its canonical text."""
    return split_of("dyck:" + normalize(prefix))


def _n_tokens(text: str) -> int:
    return len(text.encode("utf-8"))


# Tokens of one example and its separator besides its brackets: a word of W brackets is written
# in 2W - 1 bytes (prefix and answer each lose one separating space), so an example takes 2W + 15.
_EXAMPLE_OVERHEAD = _n_tokens(format_example("", "") + EXAMPLE_SEP) - 2


def dyck_max_len(max_seq_len: int, n_demos: int, max_len: int = DEFAULT_MAX_LEN) -> int:
    """The longest even word length (in brackets, at most `max_len`) such that `n_demos`
    demonstrations and a query of that length, with BOS, leave at least one position free in
    `max_seq_len` tokens (room for the token after the answer). Below 2 when nothing fits."""
    per_example = (max_seq_len - 1) // (n_demos + 1)
    longest = min(max_len, (per_example - _EXAMPLE_OVERHEAD) // 2)
    return longest - longest % 2


@dataclass(frozen=True)
class DyckExample:
    """A prompt of demonstrations plus a query, its answer, and token spans.

    Spans are [start, end) positions into `ids` (position 0 is BOS, where the tokenizer has
    one): `answer_span` holds the query's answer tokens, `demo_answer_spans` each
    demonstration's answer tokens; `pad_id` pads a batch of them in the same vocabulary."""

    query: str
    answer: str
    demos: tuple[tuple[str, str], ...]
    prompt: str
    text: str
    ids: tuple[int, ...]
    answer_span: tuple[int, int]
    demo_answer_spans: tuple[tuple[int, int], ...]
    pad_id: int = PAD_ID

    @property
    def n_demos(self) -> int:
        return len(self.demos)

    @property
    def split(self) -> Split:
        return query_split(self.query)

    @property
    def depth(self) -> int:
        """How deep the query nests (the answer only closes, so never deeper)."""
        return nesting_depth(self.query)

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        """BOS plus the prompt: what a model is given to complete."""
        return self.ids[: self.answer_span[0]]

    def tensor(self) -> torch.Tensor:
        """The full ids as a LongTensor [1, T]."""
        return torch.tensor([self.ids], dtype=torch.long)


def dyck_batch(examples: Sequence[DyckExample]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [n, longest] (the examples' pad id) and lengths [n] of the examples'
    full texts."""
    if not examples:
        raise DataError("no Dyck examples")
    lengths = torch.tensor([len(ex.ids) for ex in examples], dtype=torch.long)
    pad = examples[0].pad_id
    tokens = torch.full((len(examples), int(lengths.max())), pad, dtype=torch.long)
    for row, ex in enumerate(examples):
        tokens[row, : len(ex.ids)] = torch.tensor(ex.ids, dtype=torch.long)
    return tokens, lengths


def _demo_pair(demo: Demo) -> tuple[str, str]:
    if isinstance(demo, str):
        prefix = normalize(demo)
        answer = closing_sequence(prefix)
    else:
        prefix, answer = normalize(demo[0]), normalize(demo[1])
        if answer != closing_sequence(prefix):
            raise DataError(f"demonstration answer {answer!r} does not close {prefix!r}")
    if not answer:
        raise DataError(f"demonstration {prefix!r} is already balanced; nothing to close")
    return prefix, answer


def build_example(query: str, demos: Sequence[Demo] = ()) -> DyckExample:
    """An example for `query` (bracket text, any spacing) after `demos` (prefixes, answered by
    the reference solver, or (prefix, answer) pairs). Raises DataError for a query that is
    malformed or already balanced."""
    prefix = normalize(query)
    answer = closing_sequence(prefix)
    if not prefix:
        raise DataError("empty Dyck input; give brackets such as '( [ {'")
    if not answer:
        raise DataError(f"Dyck input {prefix!r} is already balanced; nothing to close")
    pairs = tuple(_demo_pair(d) for d in demos)

    pos = 1  # after BOS
    spans = []
    for p, a in pairs:
        start = pos + _n_tokens(format_query(p))
        spans.append((start, start + _n_tokens(a)))
        pos = start + _n_tokens(a) + _n_tokens(EXAMPLE_SEP)
    prompt = "".join(format_example(p, a) + EXAMPLE_SEP for p, a in pairs) + format_query(prefix)
    start = pos + _n_tokens(format_query(prefix))
    text = prompt + answer
    ids = tuple(_TOKENIZER.encode(text, bos=True))
    answer_span = (start, start + _n_tokens(answer))
    assert answer_span[1] == len(ids), "span bookkeeping out of step with the tokenizer"
    return DyckExample(prefix, answer, pairs, prompt, text, ids, answer_span, tuple(spans))


# ----- datasets -------------------------------------------------------------------------------
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
    spec: DyckSpec | None = None,
    n_demos: int = 0,
    seed: int = 0,
    split: str = "train",
    by_depth: bool = False,
) -> list[DyckExample]:
    """`n` in-context completion examples with words drawn from `spec` (default DyckSpec()).
    A query input belongs to 'heldout' iff its hash says so (about 10%), so train and held-out
    sets never share an input, for any seeds. `by_depth`: instead, `n` in each DEPTH_BUCKETS
    range the spec reaches (see `_depth_stratified`)."""
    if n < 0 or n_demos < 0:
        raise DataError(f"n and n_demos must be >= 0, got n={n}, n_demos={n_demos}")
    spec = spec or DyckSpec()
    rng = random.Random(seed)
    split = check_split(split)
    if by_depth:
        return _depth_stratified(rng, spec, n, n_demos, split)
    return [sample_example(rng, spec, n_demos, split) for _ in range(n)]


def _depth_stratified(
    rng: random.Random,
    spec: DyckSpec,
    per_bucket: int,
    n_demos: int,
    split: Split,
    max_draws: int = 200_000,
) -> list[DyckExample]:
    """Up to `per_bucket` examples in every DEPTH_BUCKETS range the spec can reach (depth <=
    max_depth and <= max_len / 2), in bucket order. Queries are the generator's own draws kept
    by depth (rejection sampling), so within a range they are distributed as the random draws
    are; a range the generator rarely reaches may hold fewer after `max_draws` queries."""
    deepest = min(spec.max_depth, spec.max_len // 2)
    chosen: dict[tuple[int, int | None], list[DyckExample]] = {
        b: [] for b in DEPTH_BUCKETS if b[0] <= deepest
    }
    for _ in range(max_draws):
        if all(len(found) >= per_bucket for found in chosen.values()):
            break
        query = sample_prefix(rng, spec, split)
        found = chosen[depth_bucket(nesting_depth(query))]
        if len(found) < per_bucket:
            demos = [sample_prefix(rng, spec, split) for _ in range(n_demos)]
            found.append(build_example(query, demos))
    return [ex for found in chosen.values() for ex in found]


def example_lines(rng: random.Random, spec: DyckSpec, split: Split = "train") -> Iterator[str]:
    """Endless complete examples, each ending in the separator: 'Input: ... Output: ...\\n'."""
    while True:
        prefix = sample_prefix(rng, spec, split)
        yield format_example(prefix, closing_sequence(prefix)) + EXAMPLE_SEP


def iter_packed_rows(
    batch_size: int,
    seq_len: int,
    seed: int | str = 0,
    *,
    spec: DyckSpec | None = None,
    split: str = "train",
    whole: bool = False,
) -> Iterator[torch.Tensor]:
    """Endless LongTensor batches [batch_size, seq_len] of training rows: BOS, then complete
    examples (words drawn from `spec`, default DyckSpec()) from one seeded stream, meant for a
    loss on every token. The example that runs over a row's end is cut (packing.pack_pieces),
    or with `whole` it waits for a later row and the row is right-padded (packing.pack_whole: a
    loss must ignore PAD targets)."""
    if batch_size < 1 or seq_len < 2:
        raise DataError(f"need batch_size >= 1 and seq_len >= 2, got {batch_size} and {seq_len}")
    lines = example_lines(random.Random(seed), spec or DyckSpec(), check_split(split))
    pieces = (line.encode("utf-8") for line in lines)
    pack = pack_whole if whole else pack_pieces
    while True:
        yield pack(pieces, batch_size, seq_len)


def packed_rows(
    n_rows: int,
    seq_len: int,
    seed: int | str = 0,
    *,
    spec: DyckSpec | None = None,
    split: str = "train",
    whole: bool = False,
) -> torch.Tensor:
    """`n_rows` packed rows as one LongTensor [n_rows, seq_len] (see iter_packed_rows)."""
    return next(iter_packed_rows(n_rows, seq_len, seed, spec=spec, split=split, whole=whole))
