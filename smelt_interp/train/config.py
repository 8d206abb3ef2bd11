"""Training configuration: one validated dataclass holding the Baseline's ModelConfig, built
from plain data (a preset, a JSON file, `--set key=value` overrides) and written back as plain
data for checkpoints."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smelt_interp.budget.matcher import D_HEAD_MULTIPLES
from smelt_interp.config import SIZE_LIMITS, ModelConfig, dataclass_fields
from smelt_interp.data.dyck import DyckSpec
from smelt_interp.data.trigger import TriggerSpec
from smelt_interp.errors import ConfigError, DataError
from smelt_interp.train.schedule import DECAY_SHAPES, WSDSchedule

# Fields older checkpoints saved that nothing reads any more; ignored when read back.
RETIRED_FIELDS = frozenset({"time_limit_s"})
DEFAULT_MIN_CONTEXT = 512  # a model's max_seq_len when not given: this, or seq_len if longer

# Allowed ranges, inclusive. Upper bounds are far above any real run; they refuse a typo or a
# hostile value before it is used as a count.
MAX_STEPS = 10**9
INT_RANGES: dict[str, tuple[int, int]] = {
    "seq_len": (2, SIZE_LIMITS["max_seq_len"]),
    "batch_size": (1, 1 << 20),
    "grad_accum": (1, 1 << 16),
    "steps": (1, MAX_STEPS),
    "warmup_steps": (0, MAX_STEPS),
    "eval_every": (1, MAX_STEPS),
    "ckpt_every": (1, MAX_STEPS),
    "eval_rows": (1, 1 << 16),
    "dyck_eval_n": (0, 1 << 20),
    "dyck_eval_demos": (0, 1024),
    "seed": (0, 2**31 - 1),
    "threads": (0, 4096),
}
# (low, high, interval): "[]" closed, "(]" or "()" open at that end; high None for unbounded.
REAL_RANGES: dict[str, tuple[float, float | None, str]] = {
    "lr": (0.0, None, "()"),
    "min_lr_ratio": (0.0, 1.0, "[]"),
    "weight_decay": (0.0, None, "[)"),
    "beta1": (0.0, 1.0, "[)"),
    "beta2": (0.0, 1.0, "[)"),
    "decay_fraction": (0.0, 1.0, "[]"),
    "grad_clip": (0.0, None, "()"),
    "load_balance_coef": (0.0, None, "[)"),
    "z_loss_coef": (0.0, None, "[)"),
}
CHOICES: dict[str, tuple[str, ...]] = {
    "arch": ("baseline", "smelt"),
    "decay_shape": DECAY_SHAPES,
    "parallel": ("ddp", "fsdp"),  # under torchrun: replicate (DDP) or shard (FSDP2)
    "dyck_packing": ("cut", "whole"),  # the example at a row's end: cut, or moved to a later row
}
DYCK_INTS: dict[str, tuple[int, int]] = {
    "n_pairs": (1, 1 << 10),
    "max_depth": (1, 1 << 16),
    "min_len": (2, 1 << 16),
    "max_len": (2, 1 << 16),
}
MAX_BRANCHES = 64
GIB = 1 << 30


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if not _is_int(value) or not low <= value <= high:
        allowed = (
            f"a positive integer up to {high:,}" if low == 1 else f"an integer in {low}..{high:,}"
        )
        raise ConfigError(f"{name} must be {allowed}, got {value!r}")


def _check_real(name: str, value: Any, low: float, high: float | None, interval: str) -> None:
    ok = _is_real(value)
    if ok:
        above = value > low if interval[0] == "(" else value >= low
        below = high is None or (value < high if interval[1] == ")" else value <= high)
        ok = above and below
    if not ok:
        bound = "inf)" if high is None else f"{high:g}{interval[1]}"
        raise ConfigError(
            f"{name} must be a finite number in {interval[0]}{low:g}, {bound}, got {value!r}"
        )


def _check_weights(name: str, value: Any, what: str, allow_zero: bool = False) -> None:
    """A mapping of names to finite non-negative (or, without allow_zero, positive) numbers."""
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and _is_real(v) and (v > 0 or (allow_zero and v == 0))
        for k, v in value.items()
    ):
        raise ConfigError(f"{name} maps {what}, got {value!r}")


def _check_known_fields(name: str, spec: Any, spec_class: type, what: str) -> None:
    """`spec` is a mapping whose keys are all fields of the dataclass `spec_class`."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{name} must be a mapping of {what}, got {spec!r}")
    known = [f.name for f in dataclasses.fields(spec_class)]
    unknown = sorted(str(k) for k in spec if k not in known)
    if unknown:
        raise ConfigError(f"unknown {name} field(s) {', '.join(unknown)}; use {', '.join(known)}")


def _check_dyck(spec: Any) -> None:
    """The Dyck generator's controls: known fields, integer lengths, p_open in (0, 1)."""
    _check_known_fields("dyck", spec, DyckSpec, "Dyck generator fields")
    for name, (low, high) in DYCK_INTS.items():
        if name in spec:
            _check_int(f"dyck.{name}", spec[name], low, high)
    if "p_open" in spec:
        _check_real("dyck.p_open", spec["p_open"], 0.0, 1.0, "()")
    try:
        DyckSpec(**spec)
    except DataError as exc:
        raise ConfigError(f"dyck: {exc}") from None


def trigger_spec(fields: Mapping[str, Any]) -> TriggerSpec:
    """The TriggerSpec of a config's `trigger` mapping (JSON gives `kinds` as a list)."""
    return TriggerSpec(**{k: tuple(v) if k == "kinds" else v for k, v in fields.items()})


def _check_trigger(spec: Any) -> None:
    """The trigger-task generator's controls: known fields that make a valid TriggerSpec."""
    _check_known_fields("trigger", spec, TriggerSpec, "trigger-task fields")
    if "rate" in spec and not _is_real(spec["rate"]):
        raise ConfigError(f"trigger.rate must be a number, got {spec['rate']!r}")
    if "alphabet" in spec and not _is_int(spec["alphabet"]):
        raise ConfigError(f"trigger.alphabet must be an integer, got {spec['alphabet']!r}")
    if "filler" in spec and not isinstance(spec["filler"], str):
        raise ConfigError(f"trigger.filler must be a name, got {spec['filler']!r}")
    if "kinds" in spec and not (
        isinstance(spec["kinds"], (list, tuple)) and all(isinstance(k, str) for k in spec["kinds"])
    ):
        raise ConfigError(f"trigger.kinds must be a list of names, got {spec['kinds']!r}")
    try:
        trigger_spec(spec)
    except DataError as exc:
        raise ConfigError(f"trigger: {exc}") from None


def _check_row_len(row_len: Any, data: Mapping[str, float], max_seq_len: int) -> None:
    """Per-domain row lengths: domains of `data`, integers in 2..the model's max_seq_len."""
    if not isinstance(row_len, dict):
        raise ConfigError(f"row_len must map domains to row lengths, got {row_len!r}")
    for domain, length in row_len.items():
        if domain not in data:
            raise ConfigError(
                f"row_len names domain {domain!r}, which data does not have "
                f"({', '.join(map(str, data))})"
            )
        _check_int(f"row_len.{domain}", length, 2, max_seq_len)


def _check_device(device: Any) -> None:
    """'auto', 'cpu', 'cuda' or 'cuda:N'; whether that device exists is the trainer's check."""
    ok = isinstance(device, str) and (
        device in ("auto", "cpu", "cuda")
        or (device.startswith("cuda:") and device[5:].isdigit() and device[5:].isascii())
    )
    if not ok:
        raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")


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
    trigger: dict[str, Any] = field(default_factory=dict)  # TriggerSpec fields (data.trigger)
    # Per-domain row lengths. When set, every micro-batch holds every domain, each in rows of
    # its own length and about its weight's share of batch_size * seq_len tokens ("blended"
    # steps; TrainingData.batch_parts); domains not named use seq_len.
    row_len: dict[str, int] = field(default_factory=dict)
    doc_rows: bool = False  # corpus rows hold a slice of one document each, BOS first
    dyck_packing: str = "cut"  # "whole": no Dyck example is cut at a row's end (data.packing)
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
    parallel: str = "ddp"  # ddp or fsdp; only used under torchrun (one process trains alone)
    threads: int = 0  # 0: leave torch's default
    d_head_multiple: int = 2  # SMELT's head width: a multiple of this (8 for GPU attention)

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelConfig) or self.model.is_looped:
            raise ConfigError(
                f"model must be an unlooped ModelConfig (the Baseline's shape), got {self.model!r}"
            )
        for name, (low, high) in INT_RANGES.items():
            _check_int(name, getattr(self, name), low, high)
        for name, (low, high, interval) in REAL_RANGES.items():
            _check_real(name, getattr(self, name), low, high, interval)
        for name, options in CHOICES.items():
            if not isinstance(getattr(self, name), str) or getattr(self, name) not in options:
                raise ConfigError(
                    f"{name} must be one of {', '.join(options)}, got {getattr(self, name)!r}"
                )
        for name in ("compile", "doc_rows"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        _check_device(self.device)
        m = self.d_head_multiple
        if isinstance(m, bool) or not isinstance(m, int) or m not in D_HEAD_MULTIPLES:
            raise ConfigError(
                f"d_head_multiple must be one of {', '.join(map(str, D_HEAD_MULTIPLES))}, got {m!r}"
            )
        if self.seq_len > self.model.max_seq_len:
            raise ConfigError(
                f"seq_len ({self.seq_len}) exceeds the model's max_seq_len "
                f"({self.model.max_seq_len}); raise model.max_seq_len"
            )
        _check_weights("data", self.data, "domains to non-negative weights", allow_zero=True)
        if not any(self.data.values()):
            raise ConfigError(f"data must give at least one domain a positive weight: {self.data}")
        _check_weights("arch_lr", self.arch_lr, "baseline/smelt to positive learning rates")
        if set(self.arch_lr) - set(CHOICES["arch"]):
            raise ConfigError(
                f"arch_lr maps baseline/smelt to positive learning rates, got {self.arch_lr}"
            )
        _check_dyck(self.dyck)
        _check_trigger(self.trigger)
        _check_row_len(self.row_len, self.data, self.model.max_seq_len)
        if not isinstance(self.data_paths, list) or not all(
            isinstance(p, str) and p for p in self.data_paths
        ):
            raise ConfigError(f"data_paths must be a list of paths, got {self.data_paths!r}")
        if (
            not isinstance(self.branches, list)
            or len(self.branches) > MAX_BRANCHES
            or any(not _is_int(b) or not 0 < b < self.steps for b in self.branches)
        ):
            raise ConfigError(
                f"branches must be a list of at most {MAX_BRANCHES} step counts between 0 and "
                f"steps ({self.steps}), got {self.branches!r}"
            )
        for horizon in self.horizons:
            self.schedule(horizon)

    def activation_bytes(self) -> int:
        """A lower bound of one micro-batch's training memory beyond the weights: float32
        logits, their log-softmax and gradient, and four d_model vectors per token per layer."""
        per_token = 4 * (3 * self.model.vocab_size + 4 * self.model.d_model * self.model.n_layers)
        return self.batch_size * self.seq_len * per_token

    def check_memory(self, limit: int) -> None:
        """Raise a ConfigError, before anything is allocated, if one micro-batch needs more
        than `limit` bytes (the training device's memory)."""
        need = self.activation_bytes()
        if need > limit:
            raise ConfigError(
                f"batch_size {self.batch_size} x seq_len {self.seq_len} needs at least "
                f"{need / GIB:,.1f} GiB for activations, more than the {limit / GIB:,.1f} GiB "
                f"of the training device; lower batch_size (grad_accum keeps the tokens per step)"
            )

    @property
    def horizons(self) -> list[int]:
        return sorted(set(self.branches) | {self.steps})

    def schedule(self, horizon: int) -> WSDSchedule:
        """The learning rates of one horizon (a warmup longer than the horizon is cut to it)."""
        return WSDSchedule(
            self.lr,
            min(self.warmup_steps, horizon),
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

        return match_smelt(
            self.model, seq_len=self.seq_len, d_head_multiple=self.d_head_multiple
        ).smelt

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
        if not isinstance(data, Mapping):
            raise ConfigError(f"a training config must be a mapping, got {type(data).__name__}")
        fields = dataclass_fields(
            cls, {k: v for k, v in data.items() if k not in RETIRED_FIELDS}, "training"
        )
        model = fields.get("model", {})
        if isinstance(model, Mapping):
            seq_len = fields.get("seq_len", cls.seq_len)
            fits = _is_int(seq_len) and seq_len <= SIZE_LIMITS["max_seq_len"]
            context = max(DEFAULT_MIN_CONTEXT, seq_len if fits else 0)
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
