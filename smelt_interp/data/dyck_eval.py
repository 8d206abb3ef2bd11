"""Greedy Dyck completion with a model, and exact-match accuracy.

The model API used: `model.generate(tokens: LongTensor[b, t], max_new_tokens: int,
temperature=0.0) -> LongTensor[b, t + new]` and `model.cfg.max_seq_len`. The model has no
attention mask and pads on the right only, so prompts are batched only with prompts of the
same token length; no padding is ever fed to it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from smelt_interp.data.dyck_task import Demo, DyckExample, build_example
from smelt_interp.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, ByteTokenizer
from smelt_interp.errors import DataError

NEWLINE_ID = ord("\n")
_STOP_IDS = frozenset({NEWLINE_ID, EOS_ID, PAD_ID, BOS_ID})
_SLACK = 4  # tokens generated beyond the longest answer, so over-long answers show up as wrong
_TOKENIZER = ByteTokenizer()


def _device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return torch.device("cpu")


def _max_seq_len(model: Any) -> int | None:
    return getattr(getattr(model, "cfg", None), "max_seq_len", None)


def _answer_text(new_ids: Sequence[int]) -> str:
    """Decode generated ids up to the first newline or special token, stripped."""
    kept = []
    for i in new_ids:
        if int(i) in _STOP_IDS:
            break
        kept.append(int(i))
    return _TOKENIZER.decode(kept).strip()


def _budget(model: Any, prompt_len: int, wanted: int) -> int:
    limit = _max_seq_len(model)
    if limit is None:
        return wanted
    if prompt_len >= limit:
        raise DataError(f"Dyck prompt is {prompt_len} tokens; the model's max_seq_len is {limit}")
    return min(wanted, limit - prompt_len)


def _generate(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[str]:
    """Greedy answers for prompts that all have the same length."""
    tokens = torch.tensor([list(p) for p in prompts], dtype=torch.long, device=_device(model))
    with torch.no_grad():
        out = model.generate(tokens, max_new_tokens=max_new_tokens, temperature=0.0)
    return [_answer_text(row) for row in out[:, tokens.shape[1] :].tolist()]


def complete(
    model: Any, text: str, *, demos: Sequence[Demo] = (), max_new_tokens: int | None = None
) -> str:
    """The model's greedy closing sequence for bracket `text` (e.g. '( [ {' -> '} ] )'),
    optionally after in-context `demos`. Invalid, malformed or balanced input raises DataError."""
    example = build_example(text, demos)
    prompt = example.prompt_ids
    wanted = (
        max_new_tokens if max_new_tokens is not None else len(example.ids) - len(prompt) + _SLACK
    )
    if wanted < 1:
        raise DataError(f"max_new_tokens must be >= 1, got {wanted}")
    return _generate(model, [prompt], _budget(model, len(prompt), wanted))[0]


def complete_many(
    model: Any, examples: Sequence[DyckExample], *, batch_size: int = 32
) -> list[str]:
    """Greedy answers for every example, batched by equal prompt length, in input order."""
    if batch_size < 1:
        raise DataError(f"batch_size must be >= 1, got {batch_size}")
    groups: dict[int, list[int]] = defaultdict(list)
    for i, ex in enumerate(examples):
        groups[len(ex.prompt_ids)].append(i)
    answers: list[str] = [""] * len(examples)
    for prompt_len, members in sorted(groups.items()):
        for lo in range(0, len(members), batch_size):
            chunk = members[lo : lo + batch_size]
            longest = max(examples[i].answer_span[1] - examples[i].answer_span[0] for i in chunk)
            budget = _budget(model, prompt_len, longest + _SLACK)
            for i, ans in zip(
                chunk, _generate(model, [examples[i].prompt_ids for i in chunk], budget)
            ):
                answers[i] = ans
    return answers


def exact_match_accuracy(
    model: Any, examples: Sequence[DyckExample], *, batch_size: int = 32
) -> float:
    """Fraction of examples whose greedy answer equals the reference answer exactly."""
    if not examples:
        raise DataError("exact_match_accuracy needs at least one example")
    answers = complete_many(model, examples, batch_size=batch_size)
    return sum(a == ex.answer for a, ex in zip(answers, examples)) / len(examples)
