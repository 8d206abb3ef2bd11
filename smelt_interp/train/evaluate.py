"""Evaluation during and after training: held-out loss per domain, and Dyck exact match.

Exact match is computed teacher-forced in one batched forward pass: greedy decoding returns the
reference answer exactly when the argmax at every answer position is the reference token and the
argmax after the answer is a stop token, so the two measures agree (the greedy version lives in
`smelt_interp.data.dyck.exact_match_accuracy` and is used for final reports)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from smelt_interp.data.dyck import DyckExample, make_dataset
from smelt_interp.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

if TYPE_CHECKING:
    from smelt_interp.train.config import TrainConfig

STOP_IDS = (ord("\n"), EOS_ID, PAD_ID, BOS_ID)


def heldout_dyck_examples(cfg: TrainConfig, n: int, seed: int) -> list[DyckExample]:
    """`n` held-out Dyck examples in a run's format (its Dyck spec and demonstration count);
    none when the run trains no Dyck."""
    if cfg.data.get("dyck", 0) <= 0 or n <= 0:
        return []
    return make_dataset(n, split="heldout", seed=seed, n_demos=cfg.dyck_eval_demos, **cfg.dyck)


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over every position whose target is not padding."""
    targets = tokens[:, 1:]
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        targets.reshape(-1),
        ignore_index=PAD_ID,
    )


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, rows: torch.Tensor, batch_size: int = 16) -> float:
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for lo in range(0, rows.shape[0], batch_size):
        batch = rows[lo : lo + batch_size].to(device)
        n = int((batch[:, 1:] != PAD_ID).sum())
        if n:
            total += float(lm_loss(model(batch), batch)) * n
            count += n
    return total / max(count, 1)


@torch.no_grad()
def teacher_forced_exact_match(
    model: torch.nn.Module, examples: Sequence[DyckExample], batch_size: int = 32
) -> list[bool]:
    """Per example: would greedy decoding reproduce the answer and then stop?"""
    device = next(model.parameters()).device
    stop = torch.tensor(STOP_IDS, device=device)
    results: list[bool] = []
    for lo in range(0, len(examples), batch_size):
        chunk = examples[lo : lo + batch_size]
        width = max(len(ex.ids) for ex in chunk)
        tokens = torch.full((len(chunk), width), PAD_ID, dtype=torch.long)
        for r, ex in enumerate(chunk):
            tokens[r, : len(ex.ids)] = torch.tensor(ex.ids)
        pred = model(tokens.to(device)).argmax(-1)
        for r, ex in enumerate(chunk):
            start, end = ex.answer_span
            answer_ok = torch.equal(pred[r, start - 1 : end - 1].cpu(), tokens[r, start:end])
            results.append(bool(answer_ok and torch.isin(pred[r, end - 1], stop)))
    return results
