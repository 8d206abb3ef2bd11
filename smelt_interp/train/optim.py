"""The optimizer: AdamW with weight decay on matrices only, as the fused kernel."""

from __future__ import annotations

from typing import Any

import torch

from smelt_interp.train.config import TrainConfig


def param_groups(model: torch.nn.Module, cfg: TrainConfig) -> list[dict[str, Any]]:
    """AdamW's groups: matrices decay, norms (1-D parameters) do not."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with the fused kernel (one pass over each parameter's weights and moments).

    On the default pair's CPU step it is about 3x faster than the per-parameter loop (1.2 ms
    against 3.9 ms per step, `foreach` 5.1 ms) and equal to it within float32 rounding
    (tests/test_train.py holds it to the per-parameter AdamW over 10 steps). A training state
    saved with another implementation resumes with that one: `load_state_dict` restores the
    saved group flags, so an old run stays bitwise reproducible."""
    return torch.optim.AdamW(
        param_groups(model, cfg), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=True
    )
