"""Warmup-stable-decay (WSD) learning rates with decay branches.

One stable run serves several token horizons: for each horizon H the decay phase starts at
`H - round(decay_fraction * H)` from a snapshot of the stable run, so every horizon's model
costs only its decay steps on top of the shared stable phase (the paper's protocol)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from smelt_interp.errors import ConfigError

DECAY_SHAPES = ("cosine", "linear", "1-sqrt")


def decay_factor(progress: float, shape: str) -> float:
    """Multiplier in [0, 1] at `progress` in [0, 1] through the decay phase (1 at the start)."""
    p = min(max(progress, 0.0), 1.0)
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    if shape == "linear":
        return 1.0 - p
    if shape == "1-sqrt":
        return 1.0 - math.sqrt(p)
    raise ConfigError(f"decay_shape must be one of {', '.join(DECAY_SHAPES)}, got {shape!r}")


@dataclass(frozen=True)
class WSDSchedule:
    """lr(step) for one horizon: linear warmup, constant peak, decay to min_lr_ratio * peak."""

    peak_lr: float
    warmup_steps: int
    horizon: int
    decay_fraction: float = 0.2
    decay_shape: str = "cosine"
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.horizon < 1:
            raise ConfigError(f"horizon must be >= 1 step, got {self.horizon}")
        if not 0.0 <= self.decay_fraction <= 1.0:
            raise ConfigError(f"decay_fraction must be in [0, 1], got {self.decay_fraction}")
        if self.warmup_steps < 0 or self.warmup_steps > self.decay_start:
            raise ConfigError(
                f"warmup_steps ({self.warmup_steps}) must lie in 0..decay start "
                f"({self.decay_start}) of horizon {self.horizon}"
            )
        decay_factor(0.0, self.decay_shape)

    @property
    def decay_steps(self) -> int:
        return int(round(self.decay_fraction * self.horizon))

    @property
    def decay_start(self) -> int:
        return self.horizon - self.decay_steps

    def __call__(self, step: int) -> float:
        """Learning rate for the update that takes the model from `step` to `step + 1`."""
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        if step < self.decay_start:
            return self.peak_lr
        progress = (step - self.decay_start + 1) / max(self.decay_steps, 1)
        floor = self.min_lr_ratio
        return self.peak_lr * (floor + (1.0 - floor) * decay_factor(progress, self.decay_shape))


def branch_plan(horizons: Sequence[int], decay_fraction: float) -> list[tuple[int, int]]:
    """(decay start, horizon) per horizon, ascending; the last is the main run's own decay."""
    hs = sorted(set(int(h) for h in horizons))
    if not hs or hs[0] < 1:
        raise ConfigError(f"horizons must be positive step counts, got {list(horizons)}")
    return [(h - int(round(decay_fraction * h)), h) for h in hs]
