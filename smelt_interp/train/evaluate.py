"""Evaluation during and after training: the language-modelling loss, held-out loss per domain,
and the held-out Dyck examples in a run's format (the validation draw: what a run is chosen on).

Dyck exact match during training is teacher-forced (`measure.dyck_score.teacher_forced_exact_match`,
one batched forward pass, equal to greedy decoding's); final reports also decode greedily."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from smelt_interp.data.dyck import DyckExample
from smelt_interp.data.dyck_draws import DRAW_SEED, VALIDATION, heldout_draw
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.model.transformer import next_token_ce

if TYPE_CHECKING:
    from smelt_interp.train.config import TrainConfig


def heldout_dyck_examples(
    cfg: TrainConfig, n: int, seed: int = DRAW_SEED, draw: str = VALIDATION
) -> list[DyckExample]:
    """`n` held-out Dyck examples in a run's format (its Dyck spec as a task draws it, and its
    demonstration count) from the named draw (data.dyck.heldout_draw); none when the run trains
    no Dyck. The trainer's periodic evaluation takes the validation draw at its own seed: the
    first `n` of the words a recipe sweep scores, the same for every training seed."""
    if cfg.corpus.weights.get("dyck", 0) <= 0 or n <= 0:
        return []
    spec = cfg.corpus.dyck.task_draw()
    return heldout_draw(draw, n, spec, n_demos=cfg.eval.dyck_demos, seed=seed)


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position whose target is not padding."""
    valid = tokens != PAD_ID
    return next_token_ce(logits, tokens, valid).sum() / valid[:, 1:].sum()


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
