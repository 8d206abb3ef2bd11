"""In-context Dyck prompts in a BPE model's tokens: the same text as data.dyck builds, encoded
with the model's tokenizer, and its case-study spans (each demonstration's answer, the query's
answer) carried from character offsets to token indices.

The paper gave pretrained language models in-context Dyck prompts, so a BPE model is given the
very text a byte model is, and its positions are defined in its own tokens. The tokenizer's
offsets (HF `tokenizers`' `Encoding.offsets`, characters of the text) say which characters each
token holds; the text is ASCII, so characters are bytes. What a position means then:

- **Which span a token is in.** A token belongs to the span its first non-whitespace character
  is in (a token of whitespace only: its first character). Byte-level BPE writes the space
  before a bracket into the bracket's token (" ]"), so by its very first character the first
  bracket of every answer would count as prompt; by its first non-whitespace one, " ]" is the
  answer's first token, as "]" is a byte model's. A token that merges several brackets of one
  span (" ) ]", with a tokenizer that does not split at spaces) is one position of that span:
  one answer position predicts both brackets, and one demonstration key holds both.
- **A token that crosses a boundary that matters** (its non-whitespace characters lie in an
  answer and outside it, as ": )" or ") Input" would) makes the prompt ambiguous: its answer
  positions or demonstration keys cannot be told apart from the prompt around them. Such a
  prompt is not mapped: `encode_example` raises AmbiguousPrompt, and `encode_examples`
  refuses the whole draw in one DataError line saying how many prompts cross. Dropping only
  those prompts would keep a draw biased by which brackets the tokenizer happens to merge (all
  answers opening with ")" when ": )" is a token). A tokenizer that splits words from
  punctuation and at spaces, as every `--tokenizer bpe:N` one does (GPT-2's pre-tokenizer
  pattern), never crosses one; whitespace (the space after "Output:", the newline after a
  demonstration) is a separator and crosses nothing.
- **The answer positions** are then, as for bytes, the queries predicting the answer's tokens
  (answer_span [start, end) in token indices, start - 1 .. end - 2), and `prompt_ids` is
  every token before the answer's first: with byte-level BPE the prompt ends at "Output:" and
  the model writes " ] )" (its space included), which measure.dyck_score compares with the
  answer after stripping the whitespace around it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.dyck import EXAMPLE_SEP, DyckExample, format_query
from smelt_interp.data.tokenizer import ByteTokenizer
from smelt_interp.errors import DataError

PROMPT = -1  # the region of every character outside the answers
Span = tuple[int, int]


class AmbiguousPrompt(DataError):
    """A token of the prompt holds characters of an answer and of the text around it."""


def char_spans(example: DyckExample) -> tuple[list[Span], Span]:
    """([start, end) of each demonstration's answer], [start, end) of the query's answer) in
    characters of `example.text`: the same bookkeeping as data.dyck.build_example, without BOS."""
    pos, demos = 0, []
    for prefix, answer in example.demos:
        start = pos + len(format_query(prefix))
        demos.append((start, start + len(answer)))
        pos = start + len(answer) + len(EXAMPLE_SEP)
    start = pos + len(format_query(example.query))
    answer = (start, start + len(example.answer))
    if answer[1] != len(example.text) or example.text[start:] != example.answer:
        raise DataError("Dyck example text out of step with its answer")
    return demos, answer


def token_regions(text: str, offsets: Sequence[Span], spans: Sequence[Span]) -> list[int]:
    """The region of each token with character `offsets` [start, end): the index in `spans` of
    the span its non-whitespace characters lie in (a whitespace-only token: its first
    character's), or PROMPT. AmbiguousPrompt for a token whose non-whitespace characters lie in
    more than one region."""
    region = [PROMPT] * len(text)
    for k, (start, end) in enumerate(spans):
        region[start:end] = [k] * (end - start)
    out = []
    for start, end in offsets:
        inside = {region[c] for c in range(start, end) if not text[c].isspace()}
        if len(inside) > 1:
            raise AmbiguousPrompt(
                f"token {text[start:end]!r} (characters {start}..{end - 1}) crosses the boundary "
                f"of an answer"
            )
        out.append(inside.pop() if inside else region[start] if start < end else PROMPT)
    return out


def _token_span(regions: Sequence[int], k: int, lead: int = 1) -> Span:
    """[start, end) of the tokens in region `k`, counting the `lead` tokens before the text
    (BOS, where the tokenizer adds one)."""
    at = [i for i, r in enumerate(regions) if r == k]
    if not at or at[-1] - at[0] + 1 != len(at):
        raise AmbiguousPrompt(f"answer {k} has no tokens of its own")
    return at[0] + lead, at[-1] + lead + 1


def can_pose_dyck(tokenizer: Tokenizer) -> bool:
    """Whether Dyck prompts can be posed in `tokenizer`'s tokens: bytes, or a tokenizer that
    gives character offsets (BPE, a model folder's own); not ids only."""
    return isinstance(tokenizer, ByteTokenizer) or hasattr(tokenizer, "encode_offsets")


def encode_example(example: DyckExample, tokenizer: Tokenizer) -> DyckExample:
    """`example` (spelled in bytes, data.dyck.build_example) with its ids, answer span and
    demonstration answer spans in `tokenizer`'s tokens; itself for the byte tokenizer.
    AmbiguousPrompt when a token crosses an answer's boundary (see the module docstring)."""
    if isinstance(tokenizer, ByteTokenizer):
        return example
    if not can_pose_dyck(tokenizer):
        raise DataError(
            f"cannot pose Dyck prompts in a {type(tokenizer).__name__}'s tokens: it encodes no "
            f"text (give rows as --prompt-ids)"
        )
    ids, offsets = tokenizer.encode_offsets(example.text)  # type: ignore[attr-defined]
    demos, answer = char_spans(example)
    regions = token_regions(example.text, offsets, [*demos, answer])
    lead = () if tokenizer.bos_id is None else (tokenizer.bos_id,)
    return dataclasses.replace(
        example,
        ids=(*lead, *ids),
        pad_id=tokenizer.pad_id,
        answer_span=_token_span(regions, len(demos), len(lead)),
        demo_answer_spans=tuple(_token_span(regions, k, len(lead)) for k in range(len(demos))),
    )


def encode_examples(examples: Sequence[DyckExample], tokenizer: Tokenizer) -> list[DyckExample]:
    """Every example in `tokenizer`'s tokens (encode_example), or one DataError line saying how
    many of them a token crosses an answer's boundary in, with the first such token."""
    out, crossed = [], []
    for ex in examples:
        try:
            out.append(encode_example(ex, tokenizer))
        except AmbiguousPrompt as exc:
            crossed.append(str(exc))
    if crossed:
        raise DataError(
            f"{len(crossed)} of {len(examples)} Dyck prompts cannot be posed in this tokenizer's "
            f"tokens: {crossed[0]} (a tokenizer that splits at spaces and punctuation, such as "
            f"--tokenizer bpe:N, poses them all)"
        )
    return out
