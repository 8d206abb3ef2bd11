"""Train a preset's Baseline and its budget-matched SMELT into `<out>/baseline` and `<out>/smelt`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import PAIR
from smelt_interp.train.trainer import RunResult, Trainer


def pair_configs(base: TrainConfig) -> dict[str, TrainConfig]:
    """The same run twice, once per architecture, each at its `arch_lr` learning rate if set."""
    return {
        arch: base.with_overrides({"arch": arch, "lr": base.arch_lr.get(arch, base.lr)})
        for arch in PAIR
    }


def train_pair(
    base: TrainConfig,
    out_dir: str | Path,
    *,
    archs: Sequence[str] = PAIR,
    resume: bool = False,
    progress: bool = True,
    on_metrics: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, RunResult]:
    """Train each architecture in turn; returns their results by name."""
    results = {}
    for arch, cfg in pair_configs(base).items():
        if arch not in archs:
            continue
        callback = (lambda rec, a=arch: on_metrics(a, rec)) if on_metrics else None
        trainer = Trainer(
            cfg, Path(out_dir) / arch, resume=resume, progress=progress, on_metrics=callback
        )
        results[arch] = trainer.run()
    return results
