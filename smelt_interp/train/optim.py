"""The optimizer: AdamW with weight decay on matrices only, as the fused kernel, and the looped
layers of a SMELT model at their own multiple of the learning rate if one is set."""

from __future__ import annotations

from typing import Any

import torch

from smelt_interp.train.config import TrainConfig


def _looped_prefixes(model: torch.nn.Module) -> tuple[str, ...]:
    """Parameter-name prefixes of the blocks a looped model runs more than once."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or not cfg.is_looped:
        return ()
    return tuple(f"blocks.{layer}." for layer in range(cfg.loop_start, cfg.loop_end))


def param_groups(model: torch.nn.Module, cfg: TrainConfig) -> list[dict[str, Any]]:
    """AdamW's groups: matrices decay, norms (1-D parameters) do not. With `loop_lr_scale` not 1
    on a looped model, the looped blocks' parameters form their own two groups, whose
    `lr_scale` the trainer multiplies into each step's rate; otherwise there are two groups, so
    a state saved before the option existed still loads."""
    looped = _looped_prefixes(model) if cfg.optim.loop_lr_scale != 1.0 else ()
    groups: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for name, param in model.named_parameters():
        key = (name.startswith(looped), param.dim() >= 2)  # no prefixes: never looped
        groups.setdefault(key, []).append(param)
    return [
        {
            "params": groups[key],
            "weight_decay": cfg.optim.weight_decay if key[1] else 0.0,
            **({"lr_scale": cfg.optim.loop_lr_scale} if key[0] else {}),
        }
        for key in sorted(groups, key=lambda key: (key[0], not key[1]))
    ]


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with the fused kernel (one pass over each parameter's weights and moments).

    On the default pair's CPU step it is about 3x faster than the per-parameter loop (1.2 ms
    against 3.9 ms per step, `foreach` 5.1 ms) and equal to it within float32 rounding
    (tests/train/test_train.py holds it to the per-parameter AdamW over 10 steps). A training state
    saved with another implementation resumes with that one: `load_state_dict` restores the
    saved group flags, so an old run stays bitwise reproducible."""
    return torch.optim.AdamW(
        param_groups(model, cfg),
        lr=cfg.optim.lr,
        betas=(cfg.optim.beta1, cfg.optim.beta2),
        fused=True,
    )
