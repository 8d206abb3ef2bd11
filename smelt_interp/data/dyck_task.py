"""The Dyck completion task in BIG-Bench `dyck_languages` text form, and one example with the
exact token positions the probes read.

Format (fixed here, used everywhere):

    one example     "Input: ( [ { } Output: ] )"      brackets separated by single spaces
    separator       "\\n" after every complete example (demonstrations, packed training rows)
    prompt          demonstrations, each followed by "\\n", then "Input: <query> Output: "
                    (with the trailing space), so the answer's first byte is the next token
    full text       prompt + answer (no trailing newline)
    token ids       [BOS] + UTF-8 bytes of the full text

The model's answer is what it writes after the final "Output: " up to a newline or EOS."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

import torch

from smelt_interp.data.dyck_lang import closing_sequence, normalize
from smelt_interp.data.split import Split, split_of
from smelt_interp.data.tokenizer import ByteTokenizer
from smelt_interp.errors import DataError

EXAMPLE_SEP = "\n"
_TOKENIZER = ByteTokenizer()

Demo = Union[str, tuple[str, str]]


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


@dataclass(frozen=True)
class DyckExample:
    """A prompt of demonstrations plus a query, its answer, and token spans.

    Spans are [start, end) positions into `ids` (position 0 is BOS): `answer_span` holds the
    query's answer tokens, `demo_answer_spans` each demonstration's answer tokens."""

    query: str
    answer: str
    demos: tuple[tuple[str, str], ...]
    prompt: str
    text: str
    ids: tuple[int, ...]
    answer_span: tuple[int, int]
    demo_answer_spans: tuple[tuple[int, int], ...]

    @property
    def n_demos(self) -> int:
        return len(self.demos)

    @property
    def split(self) -> Split:
        return query_split(self.query)

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        """BOS plus the prompt: what a model is given to complete."""
        return self.ids[: self.answer_span[0]]

    def tensor(self) -> torch.Tensor:
        """The full ids as a LongTensor [1, T]."""
        return torch.tensor([self.ids], dtype=torch.long)


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
