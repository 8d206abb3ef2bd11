"""Training configuration: one validated dataclass holding the Baseline's ModelConfig, built
from plain data (a preset, a JSON file, `--set key=value` overrides) and written back as plain
data for checkpoints."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smelt_interp.budget.matcher import D_HEAD_MULTIPLES
from smelt_interp.config import ARCHS, BASELINE, SIZE_LIMITS, ModelConfig
from smelt_interp.data.assoc_recall import AssocRecallSpec
from smelt_interp.data.dyck import TASK_DYCK, DyckSpec
from smelt_interp.data.trigger import TriggerSpec
from smelt_interp.errors import ConfigError
from smelt_interp.fields import (
    bool_field,
    check_fields,
    check_int,
    choice_field,
    int_field,
    is_int,
    is_real,
    known_fields,
    plain,
    real_field,
    shown,
)
from smelt_interp.train.schedule import DECAY_SHAPES, WSDSchedule

DEFAULT_MIN_CONTEXT = 512  # a model's max_seq_len when not given: this, or seq_len if longer

# Upper bounds of counts (in the fields' metadata) are far above any real run; they refuse a
# typo or a hostile value before it is used as a count.
MAX_STEPS = 10**9
MAX_BRANCHES = 64
GIB = 1 << 30
PARALLEL = ("ddp", "fsdp")  # under torchrun: replicate (DDP) or shard (FSDP2)
DYCK_PACKING = ("cut", "whole")  # the example at a row's end: cut, or moved to a later row


def _check_weights(name: str, value: Any, what: str, allow_zero: bool = False) -> None:
    """A mapping of names to finite non-negative (or, without allow_zero, positive) numbers."""
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and is_real(v) and (v > 0 or (allow_zero and v == 0))
        for k, v in value.items()
    ):
        raise ConfigError(f"{name} maps {what}, got {shown(value)}")


def _check_row_len(row_len: Any, data: Mapping[str, float], max_seq_len: int) -> None:
    """Per-domain row lengths: domains of `data`, integers in 2..the model's max_seq_len."""
    if not isinstance(row_len, dict):
        raise ConfigError(f"row_len must map domains to row lengths, got {shown(row_len)}")
    for domain, length in row_len.items():
        if domain not in data:
            raise ConfigError(
                f"row_len names domain {shown(domain)}, which data does not have "
                f"({', '.join(shown(d) for d in data)})"
            )
        check_int(f"row_len[{shown(domain)}]", length, 2, max_seq_len)


def _check_device(device: Any) -> None:
    """'auto', 'cpu', 'cuda' or 'cuda:N'; whether that device exists is the trainer's check."""
    ok = isinstance(device, str) and (
        device in ("auto", "cpu", "cuda")
        or (device.startswith("cuda:") and device[5:].isdigit() and device[5:].isascii())
    )
    if not ok:
        raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {shown(device)}")


@dataclass
class TrainConfig:
    """Everything a run needs. `model` is the Baseline's shape; an `arch="smelt"` run trains the
    SMELT config the budget matcher finds for it (see `model_config`)."""

    model: ModelConfig = field(default_factory=ModelConfig.baseline)
    arch: str = choice_field(BASELINE, ARCHS)  # smelt: matched from the baseline shape
    data: dict[str, float] = field(default_factory=lambda: {"dyck": 1.0})
    dyck: DyckSpec = TASK_DYCK  # a mapping of DyckSpec fields is turned into one
    data_paths: list[str] = field(default_factory=list)  # user text files/folders/JSONL
    # A folder of prepared token shards (python -m smelt_interp.data prepare): its domains are
    # training domains (weights in `data`), read by train.shard_loader; "" for none.
    shards: str = ""
    trigger: TriggerSpec = TriggerSpec()  # the trigger-task rows (data.trigger)
    assoc_recall: AssocRecallSpec = AssocRecallSpec()  # the associative-recall rows
    # Per-domain row lengths. When set, every micro-batch holds every domain, each in rows of
    # its own length and about its weight's share of batch_size * seq_len tokens ("blended"
    # steps; TrainingData.batch_parts); domains not named use seq_len.
    row_len: dict[str, int] = field(default_factory=dict)
    doc_rows: bool = bool_field(False)  # corpus rows hold a slice of one document each, BOS first
    # "whole": no Dyck example is cut at a row's end (data.packing)
    dyck_packing: str = choice_field("cut", DYCK_PACKING)
    seq_len: int = int_field(320, 2, SIZE_LIMITS["max_seq_len"])
    batch_size: int = int_field(16, 1, 1 << 20)
    grad_accum: int = int_field(1, 1, 1 << 16)
    lr: float = real_field(2e-3, 0.0, None, "()")
    arch_lr: dict[str, float] = field(default_factory=dict)  # per-architecture lr in a pair
    # A looped block's weights act on every visit, so one step moves what they compute about
    # n_loops times over: its parameters train at this multiple of `lr` (no effect unlooped).
    loop_lr_scale: float = real_field(1.0, 0.0, None, "()")
    min_lr_ratio: float = real_field(0.0, 0.0, 1.0, "[]")
    weight_decay: float = real_field(0.1, 0.0, None, "[)")
    beta1: float = real_field(0.9, 0.0, 1.0, "[)")
    beta2: float = real_field(0.95, 0.0, 1.0, "[)")
    # a warmup longer than a horizon's stable phase is cut to it (see `schedule`)
    warmup_steps: int = int_field(50, 0, MAX_STEPS)
    steps: int = int_field(1000, 1, MAX_STEPS)  # the main horizon, in optimizer steps
    branches: list[int] = field(default_factory=list)  # extra horizons (decay branches)
    decay_fraction: float = real_field(0.2, 0.0, 1.0, "[]")
    decay_shape: str = choice_field("cosine", DECAY_SHAPES)
    grad_clip: float = real_field(1.0, 0.0, None, "()")
    # > 0: the saved and evaluated model is an exponential moving average of the weights, this
    # much of the average kept per step (its window is about 1 / (1 - ema_decay) steps); the
    # trained weights stay in state.pt. 0: the trained weights themselves.
    ema_decay: float = real_field(0.0, 0.0, 1.0, "[)")
    load_balance_coef: float = real_field(0.01, 0.0, None, "[)")
    z_loss_coef: float = real_field(1e-3, 0.0, None, "[)")
    eval_every: int = int_field(200, 1, MAX_STEPS)
    eval_rows: int = int_field(16, 1, 1 << 16)
    dyck_eval_n: int = int_field(200, 0, 1 << 20)
    dyck_eval_demos: int = int_field(0, 0, 1024)
    ckpt_every: int = int_field(100, 1, MAX_STEPS)
    # a copy of each periodic checkpoint up to this step is kept (run_folder.KEPT_DIR); 0: none
    keep_ckpts_until: int = int_field(0, 0, MAX_STEPS)
    seed: int = int_field(0, 0, 2**31 - 1)
    device: str = "auto"
    compile: bool = bool_field(False)
    # ddp or fsdp; only used under torchrun (one process trains alone)
    parallel: str = choice_field("ddp", PARALLEL)
    threads: int = int_field(0, 0, 4096)  # 0: leave torch's default
    d_head_multiple: int = 2  # SMELT's head width: a multiple of this (8 for GPU attention)

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelConfig) or self.model.is_looped:
            raise ConfigError(
                "model must be an unlooped ModelConfig (the Baseline's shape), "
                f"got {shown(self.model)}"
            )
        self.dyck = DyckSpec.from_mapping(self.dyck)
        self.trigger = TriggerSpec.from_mapping(self.trigger)
        self.assoc_recall = AssocRecallSpec.from_mapping(self.assoc_recall)
        check_fields(self)
        _check_device(self.device)
        m = self.d_head_multiple
        if isinstance(m, bool) or not isinstance(m, int) or m not in D_HEAD_MULTIPLES:
            raise ConfigError(
                "d_head_multiple must be one of "
                f"{', '.join(map(str, D_HEAD_MULTIPLES))}, got {shown(m)}"
            )
        if self.seq_len > self.model.max_seq_len:
            raise ConfigError(
                f"seq_len ({self.seq_len}) exceeds the model's max_seq_len "
                f"({self.model.max_seq_len}); raise model.max_seq_len"
            )
        _check_weights("data", self.data, "domains to non-negative weights", allow_zero=True)
        if not any(self.data.values()):
            raise ConfigError(
                f"data must give at least one domain a positive weight: {shown(self.data)}"
            )
        _check_weights("arch_lr", self.arch_lr, "baseline/smelt to positive learning rates")
        if set(self.arch_lr) - set(ARCHS):
            raise ConfigError(
                f"arch_lr maps baseline/smelt to positive learning rates, got {shown(self.arch_lr)}"
            )
        _check_row_len(self.row_len, self.data, self.model.max_seq_len)
        if not isinstance(self.data_paths, list) or not all(
            isinstance(p, str) and p for p in self.data_paths
        ):
            raise ConfigError(f"data_paths must be a list of paths, got {shown(self.data_paths)}")
        if not isinstance(self.shards, str):
            raise ConfigError(f"shards must be a folder path, got {shown(self.shards)}")
        if (
            not isinstance(self.branches, list)
            or len(self.branches) > MAX_BRANCHES
            or any(not is_int(b) or not 0 < b < self.steps for b in self.branches)
        ):
            raise ConfigError(
                f"branches must be a list of at most {MAX_BRANCHES} step counts between 0 and "
                f"steps ({self.steps}), got {shown(self.branches)}"
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
        """The learning rates of one horizon. A warmup longer than the horizon's stable phase
        is cut to it: warmup ends where the decay starts, so a short run still decays."""
        decay_start = horizon - int(round(self.decay_fraction * horizon))
        return WSDSchedule(
            self.lr,
            min(self.warmup_steps, decay_start),
            horizon,
            self.decay_fraction,
            self.decay_shape,
            self.min_lr_ratio,
        )

    def model_config(self) -> ModelConfig:
        """The model to train: the Baseline shape, or for arch 'smelt' the SMELT config the budget
        matcher finds for it (the matcher runs here, when a model is built, not on validation)."""
        if self.arch == BASELINE:
            return self.model
        from smelt_interp.budget import match_smelt

        return match_smelt(
            self.model, seq_len=self.seq_len, d_head_multiple=self.d_head_multiple
        ).smelt

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch_size * self.grad_accum

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (the model and the specs as dicts of their fields), as
        checkpoints save it."""
        return plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build from plain data. `model` is a dict of ModelConfig fields for the Baseline; a
        missing `max_seq_len` is 512, or `seq_len` when that is longer."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"a training config must be a mapping, got {type(data).__name__}")
        fields = known_fields(cls, data, "training")
        model = fields.get("model", {})
        if isinstance(model, Mapping):
            seq_len = fields.get("seq_len", cls.seq_len)
            fits = is_int(seq_len) and seq_len <= SIZE_LIMITS["max_seq_len"]
            context = max(DEFAULT_MIN_CONTEXT, seq_len if fits else 0)
            model = known_fields(ModelConfig, model, "model")
            fields["model"] = ModelConfig.baseline(**{"max_seq_len": context, **model})
        return cls(**fields)

    def with_overrides(self, overrides: Mapping[str, Any]) -> TrainConfig:
        """A copy with `key=value` overrides applied (see apply_overrides)."""
        return TrainConfig.from_dict(apply_overrides(self.to_dict(), overrides))

    def same_run(self, other: TrainConfig) -> bool:
        """Whether the two configs train the same model: equal in every field but `arch_lr`,
        which train.trainer.pair_configs has already folded into each model's `lr`: a new SMELT
        rate in a pair preset leaves the pair's Baseline runs resumable and reusable."""
        unpaired = {"arch_lr": {}}
        return dataclasses.replace(self, **unpaired) == dataclasses.replace(other, **unpaired)


# fields with sub-fields
NESTED = ("model", "dyck", "trigger", "assoc_recall", "data", "row_len", "arch_lr")


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Plain config data with `key=value` overrides applied: `model.d_model=64` reaches into
    the model's fields, `dyck.p_open=0.3` into the Dyck spec's (likewise trigger, assoc_recall,
    data, row_len, arch_lr). A sub-field of a mapping `data` lacks starts from that spec's own
    defaults."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    out = dict(data)
    for key, value in overrides.items():
        head, _, rest = key.partition(".")
        if head not in known:
            raise ConfigError(f"unknown training field {shown(head)}")
        if not rest:
            out[head] = value
            continue
        current = out.get(head, {})
        if head not in NESTED or not isinstance(current, Mapping):
            raise ConfigError(f"{head} has no sub-fields (got {shown(key)})")
        out[head] = {**current, rest: value}
    return out
