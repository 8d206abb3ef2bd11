"""Training configuration: one validated dataclass holding the Baseline's ModelConfig, built
from plain data (a preset, a JSON file, `--set key=value` overrides) and written back as plain
data for checkpoints."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smelt_interp.config import ModelConfig
from smelt_interp.errors import ConfigError
from smelt_interp.train.schedule import DECAY_SHAPES, WSDSchedule

# Fields older checkpoints saved that nothing reads any more; ignored when read back.
RETIRED_FIELDS = frozenset({"time_limit_s"})
DEFAULT_MIN_CONTEXT = 512  # a model's max_seq_len when not given: this, or seq_len if longer


@dataclass
class TrainConfig:
    """Everything a run needs. `model` is the Baseline's shape; an `arch="smelt"` run trains the
    SMELT config the budget matcher finds for it (see `model_config`)."""

    model: ModelConfig = field(default_factory=ModelConfig.baseline)
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

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelConfig) or self.model.is_looped:
            raise ConfigError(
                f"model must be an unlooped ModelConfig (the Baseline's shape), got {self.model!r}"
            )
        if self.arch not in ("baseline", "smelt"):
            raise ConfigError(f"arch must be 'baseline' or 'smelt', got {self.arch!r}")
        for name in ("seq_len", "batch_size", "grad_accum", "steps", "eval_every", "ckpt_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.seq_len > self.model.max_seq_len:
            raise ConfigError(
                f"seq_len ({self.seq_len}) exceeds the model's max_seq_len "
                f"({self.model.max_seq_len}); raise model.max_seq_len"
            )
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

    def model_config(self) -> ModelConfig:
        """The model to train: the Baseline shape, or for arch 'smelt' the SMELT config the budget
        matcher finds for it (the matcher runs here, when a model is built, not on validation)."""
        if self.arch == "baseline":
            return self.model
        from smelt_interp.budget import match_smelt

        return match_smelt(self.model, seq_len=self.seq_len).smelt

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch_size * self.grad_accum

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (the model as a dict of its fields), as checkpoints save it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build from plain data. `model` is a dict of ModelConfig fields for the Baseline; a
        missing `max_seq_len` is 512, or `seq_len` when that is longer."""
        fields = {k: v for k, v in data.items() if k not in RETIRED_FIELDS}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ConfigError(f"unknown training field(s): {', '.join(unknown)}")
        model = fields.get("model", {})
        if isinstance(model, Mapping):
            seq_len = fields.get("seq_len", cls.seq_len)
            context = max(DEFAULT_MIN_CONTEXT, seq_len if isinstance(seq_len, int) else 0)
            try:
                fields["model"] = ModelConfig.baseline(**{"max_seq_len": context, **model})
            except TypeError as exc:
                raise ConfigError(f"model: {exc}") from None
        return cls(**fields)

    def with_overrides(self, overrides: Mapping[str, Any]) -> TrainConfig:
        """A copy with `key=value` overrides applied; `model.d_model=64` reaches into the model's
        fields (and `dyck.max_len=50` into the Dyck spec's, likewise)."""
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
