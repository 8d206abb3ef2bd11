"""Training configuration: one validated dataclass, loadable from a preset, a JSON file and
`--set key=value` overrides, in that order."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smelt_interp.config import ModelConfig
from smelt_interp.errors import ConfigError
from smelt_interp.train.schedule import DECAY_SHAPES, WSDSchedule


@dataclass
class TrainConfig:
    """Everything a run needs besides the model shape (`model`, a ModelConfig field dict)."""

    model: dict[str, Any] = field(default_factory=dict)
    arch: str = "baseline"  # baseline, smelt (matched from the baseline shape)
    data: dict[str, float] = field(default_factory=lambda: {"dyck": 1.0})
    dyck: dict[str, Any] = field(
        default_factory=lambda: {"n_pairs": 4, "max_depth": 8, "min_len": 2, "max_len": 100}
    )
    data_paths: list[str] = field(default_factory=list)  # user text files/folders/JSONL
    seq_len: int = 320
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 2e-3
    arch_lr: dict[str, float] = field(default_factory=dict)  # per-architecture lr in a pair
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    warmup_steps: int = 50
    steps: int = 1000  # the main horizon, in optimizer steps
    branches: list[int] = field(default_factory=list)  # extra horizons (decay branches)
    decay_fraction: float = 0.2
    decay_shape: str = "cosine"
    grad_clip: float = 1.0
    load_balance_coef: float = 0.01
    z_loss_coef: float = 1e-3
    eval_every: int = 200
    eval_rows: int = 16
    dyck_eval_n: int = 200
    dyck_eval_demos: int = 0
    ckpt_every: int = 100
    seed: int = 0
    device: str = "auto"
    compile: bool = False
    threads: int = 0  # 0: leave torch's default
    time_limit_s: float = 0.0  # 0: none; else stop the stable phase early

    def __post_init__(self) -> None:
        if self.arch not in ("baseline", "smelt"):
            raise ConfigError(f"arch must be 'baseline' or 'smelt', got {self.arch!r}")
        for name in ("seq_len", "batch_size", "grad_accum", "steps", "eval_every", "ckpt_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not self.lr > 0:
            raise ConfigError(f"lr must be positive, got {self.lr}")
        for arch, lr in self.arch_lr.items():
            if arch not in ("baseline", "smelt") or not isinstance(lr, (int, float)) or not lr > 0:
                raise ConfigError(
                    f"arch_lr maps baseline/smelt to positive learning rates, got {self.arch_lr}"
                )
        if self.decay_shape not in DECAY_SHAPES:
            raise ConfigError(
                f"decay_shape must be one of {', '.join(DECAY_SHAPES)}, got {self.decay_shape!r}"
            )
        if any(not isinstance(b, int) or not 0 < b < self.steps for b in self.branches):
            raise ConfigError(
                f"branches must be step counts between 0 and steps ({self.steps}), "
                f"got {self.branches}"
            )
        if not self.data or any(w < 0 for w in self.data.values()):
            raise ConfigError(f"data must map domains to non-negative weights, got {self.data}")
        for horizon in self.horizons:
            WSDSchedule(
                self.lr,
                min(self.warmup_steps, horizon),
                horizon,
                self.decay_fraction,
                self.decay_shape,
                self.min_lr_ratio,
            )
        self.model_config()

    @property
    def horizons(self) -> list[int]:
        return sorted(set(self.branches) | {self.steps})

    def schedule(self, horizon: int) -> WSDSchedule:
        return WSDSchedule(
            self.lr,
            self.warmup_steps,
            horizon,
            self.decay_fraction,
            self.decay_shape,
            self.min_lr_ratio,
        )

    def baseline_config(self) -> ModelConfig:
        try:
            return ModelConfig.baseline(**{"max_seq_len": max(512, self.seq_len), **self.model})
        except TypeError as exc:
            raise ConfigError(f"model: {exc}") from None

    def model_config(self) -> ModelConfig:
        """The model to train: the baseline shape, or the SMELT config matched to it."""
        base = self.baseline_config()
        if self.arch == "baseline":
            return base
        from smelt_interp.budget import match_smelt

        return match_smelt(base, seq_len=self.seq_len).smelt

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch_size * self.grad_accum

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown training field(s): {', '.join(unknown)}")
        return cls(**dict(data))

    def with_overrides(self, overrides: Mapping[str, Any]) -> TrainConfig:
        """Apply `key=value` overrides; `model.d_model=64` reaches into the model dict."""
        data = self.to_dict()
        for key, value in overrides.items():
            head, _, rest = key.partition(".")
            if head not in data:
                raise ConfigError(f"unknown training field {head!r}")
            if rest:
                if not isinstance(data[head], dict):
                    raise ConfigError(f"{head} has no sub-fields")
                data[head] = {**data[head], rest: value}
            else:
                data[head] = value
        return TrainConfig.from_dict(data)


def parse_override(text: str) -> tuple[str, Any]:
    """'steps=200' -> ('steps', 200); values are JSON when they parse, else strings."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"expected key=value, got {text!r}")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def load_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file holds a JSON object")
    return data
