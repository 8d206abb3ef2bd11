"""Scoring a model's Dyck answers, the one definition every measure uses: greedy completion and
its exact-match accuracy, and the teacher-forced equivalent read off one forward pass.

Exact match means the model writes the reference answer and then stops (a newline or a special
token). Teacher-forced, that is: the argmax at every answer position is the reference token and
the argmax after the answer is a stop token, so for a model without sampling the two measures
agree example by example; the teacher-forced one needs one batched pass instead of a decoding
loop. Answer positions: the answer's tokens sit at [start, end); the position that predicts
token j is j - 1, so the answer is predicted at start - 1 .. end - 2 and the stop at end - 1.

On a BPE model the examples are in its tokens (data.dyck_tokens.encode_example: spans in token
indices) and the same measures hold in token space: a stop is any special token or a token whose
text begins with a newline (`stop_ids`; BPE merges a newline with the indentation after it), and
a greedy answer is the generated text up to its first newline, whitespace stripped. There the
teacher-forced measure asks for the tokenizer's own spelling of the answer (" ]", " )"), so it
can only be lower than greedy decoding's, which compares text: every teacher-forced hit is a
greedy one, but a model that writes the answer in other tokens is a greedy hit alone.

The model API used: `model(tokens) -> logits`, `model.generate(tokens: LongTensor[b, t],
max_new_tokens: int, temperature=0.0) -> LongTensor[b, t + new]` and `model.cfg.max_seq_len`.
The model has no attention mask, so prompts are batched for generation only with prompts of the
same token length; teacher-forced batches are right-padded, which no answer position attends to."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.dyck import Demo, DyckExample, build_example, dyck_batch
from smelt_interp.data.dyck_tokens import encode_example
from smelt_interp.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, ByteTokenizer
from smelt_interp.errors import DataError

Span = tuple[int, int]
NEWLINE_ID = ord("\n")
STOP_IDS = (NEWLINE_ID, EOS_ID, PAD_ID, BOS_ID)
_SLACK = 4  # tokens generated beyond the longest answer, so over-long answers show up as wrong
_TOKENIZER = ByteTokenizer()


def stop_ids(tokenizer: Tokenizer | None = None) -> tuple[int, ...]:
    """The ids that end an answer in `tokenizer` (default bytes): the specials and every token
    whose text begins with a newline (for bytes, STOP_IDS)."""
    if tokenizer is None or isinstance(tokenizer, ByteTokenizer):
        return STOP_IDS
    return _newline_ids(tokenizer)


@functools.lru_cache(maxsize=8)
def _newline_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    specials = tuple(
        i for i in (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) if i is not None
    )
    lines = [i for i in range(tokenizer.vocab_size) if i not in specials]
    return specials + tuple(i for i in lines if tokenizer.decode([i]).startswith("\n"))


def _device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return torch.device("cpu")


# ----- teacher-forced ---------------------------------------------------------------------
def answer_positions(
    spans: Sequence[Span], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [b, n], valid [b, n]): the positions predicting each row's answer tokens,
    right-padded (padding repeats position 0 and is marked invalid)."""
    n = max(end - start for start, end in spans)
    pos = torch.zeros(len(spans), n, dtype=torch.long)
    valid = torch.zeros(len(spans), n, dtype=torch.bool)
    for row, (start, end) in enumerate(spans):
        pos[row, : end - start] = torch.arange(start - 1, end - 1)
        valid[row, : end - start] = True
    return pos.to(device), valid.to(device)


def answer_scores(
    predicted: torch.Tensor,
    tokens: torch.Tensor,
    spans: Sequence[Span],
    stops: Sequence[int] = STOP_IDS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced scores of each row's answer, tokens[row, start:end] for its span.

    `predicted` holds logits [b, t, vocab] (or their argmax ids [b, t]) of one forward pass over
    `tokens` [b, t]. Returns (answer tokens predicted right [b], exact [b]), where exact means
    greedy decoding would write the whole answer and then stop (one of `stops`, the model's
    stop_ids)."""
    pred = predicted.argmax(dim=-1) if predicted.dim() == 3 else predicted
    tokens = tokens.to(pred.device)
    pos, valid = answer_positions(spans, pred.device)
    right = (pred.gather(1, pos) == tokens.gather(1, pos + 1)) & valid
    after = torch.tensor([[end - 1] for _, end in spans], device=pred.device)
    stops = torch.isin(pred.gather(1, after)[:, 0], torch.tensor(stops, device=pred.device))
    return right.sum(dim=1), (right | ~valid).all(dim=1) & stops


@torch.no_grad()
def teacher_forced_exact_match(
    model: Any,
    examples: Sequence[DyckExample],
    batch_size: int = 32,
    tokenizer: Tokenizer | None = None,
) -> list[bool]:
    """Per example: would greedy decoding reproduce the answer and then stop? Right-padded
    batches of `batch_size` examples (in `tokenizer`'s tokens, default bytes), one forward
    pass each."""
    stops = stop_ids(tokenizer)
    results: list[bool] = []
    for lo in range(0, len(examples), batch_size):
        chunk = examples[lo : lo + batch_size]
        tokens, _ = dyck_batch(chunk)
        logits = model(tokens.to(_device(model)))
        spans = [ex.answer_span for ex in chunk]
        results += answer_scores(logits, tokens, spans, stops)[1].tolist()
    return results


# ----- greedy completion --------------------------------------------------------------------
def _answer_text(new_ids: Sequence[int], tokenizer: Tokenizer | None = None) -> str:
    """Decode generated ids up to the first special token, then the text up to its first
    newline, stripped."""
    tokenizer = tokenizer or _TOKENIZER
    specials = tuple(
        i for i in (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) if i is not None
    )
    kept = []
    for i in new_ids:
        if int(i) in specials:
            break
        kept.append(int(i))
    return tokenizer.decode(kept).split("\n", 1)[0].strip()


def _answer_room(example: DyckExample, tokenizer: Tokenizer | None) -> int:
    """Tokens an answer may take: its own for bytes; for BPE its characters and the space
    before them, so a model that spells the answer in other (shorter) tokens still fits."""
    start, end = example.answer_span
    if tokenizer is None or isinstance(tokenizer, ByteTokenizer):
        return end - start
    return max(end - start, len(example.answer) + 1)


def _budget(model: Any, prompt_len: int, wanted: int) -> int:
    limit = getattr(getattr(model, "cfg", None), "max_seq_len", None)
    if limit is None:
        return wanted
    if prompt_len >= limit:
        raise DataError(f"Dyck prompt is {prompt_len} tokens; the model's max_seq_len is {limit}")
    return min(wanted, limit - prompt_len)


def _generate(
    model: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    tokenizer: Tokenizer | None = None,
) -> list[str]:
    """Greedy answers for prompts that all have the same length."""
    tokens = torch.tensor([list(p) for p in prompts], dtype=torch.long, device=_device(model))
    with torch.no_grad():
        out = model.generate(tokens, max_new_tokens=max_new_tokens, temperature=0.0)
    return [_answer_text(row, tokenizer) for row in out[:, tokens.shape[1] :].tolist()]


def complete(
    model: Any,
    text: str,
    *,
    demos: Sequence[Demo] = (),
    max_new_tokens: int | None = None,
    tokenizer: Tokenizer | None = None,
) -> str:
    """The model's greedy closing sequence for bracket `text` (e.g. '( [ {' -> '} ] )'),
    optionally after in-context `demos`, in `tokenizer`'s tokens (default bytes). Invalid,
    malformed or balanced input raises DataError."""
    example = encode_example(build_example(text, demos), tokenizer or _TOKENIZER)
    prompt = example.prompt_ids
    wanted = (
        max_new_tokens if max_new_tokens is not None else _answer_room(example, tokenizer) + _SLACK
    )
    if wanted < 1:
        raise DataError(f"max_new_tokens must be >= 1, got {wanted}")
    return _generate(model, [prompt], _budget(model, len(prompt), wanted), tokenizer)[0]


def complete_many(
    model: Any,
    examples: Sequence[DyckExample],
    *,
    batch_size: int = 32,
    tokenizer: Tokenizer | None = None,
) -> list[str]:
    """Greedy answers for every example (in `tokenizer`'s tokens, default bytes), batched by
    equal prompt length, in input order."""
    if batch_size < 1:
        raise DataError(f"batch_size must be >= 1, got {batch_size}")
    groups: dict[int, list[int]] = defaultdict(list)
    for i, ex in enumerate(examples):
        groups[len(ex.prompt_ids)].append(i)
    answers: list[str] = [""] * len(examples)
    for prompt_len, members in sorted(groups.items()):
        for lo in range(0, len(members), batch_size):
            chunk = members[lo : lo + batch_size]
            longest = max(_answer_room(examples[i], tokenizer) for i in chunk)
            budget = _budget(model, prompt_len, longest + _SLACK)
            prompts = [examples[i].prompt_ids for i in chunk]
            for i, ans in zip(chunk, _generate(model, prompts, budget, tokenizer)):
                answers[i] = ans
    return answers


def exact_match_accuracy(
    model: Any,
    examples: Sequence[DyckExample],
    *,
    batch_size: int = 32,
    tokenizer: Tokenizer | None = None,
) -> float:
    """Fraction of examples whose greedy answer equals the reference answer exactly."""
    if not examples:
        raise DataError("exact_match_accuracy needs at least one example")
    answers = complete_many(model, examples, batch_size=batch_size, tokenizer=tokenizer)
    return sum(a == ex.answer for a, ex in zip(answers, examples)) / len(examples)
