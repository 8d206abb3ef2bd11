"""Training configuration: `TrainConfig`, the Baseline's ModelConfig and the run's identity (arch,
seed) beside one section dataclass per component (corpus, batch, optim, schedule, eval,
checkpoint, runtime), built from plain data (a preset, a JSON file, `--set key=value`) and
written back as plain data for checkpoints.

Spellings. A field is named by its path, `optim.lr` or `corpus.dyck.p_open`, or by its flat key,
the one name it had before the sections: `lr`, `dyck.p_open`, `data.code` (a domain's weight),
`batch_size`. Flat keys are every section field's own name, except the few renamed fields in
`RENAMED`; `FLAT_PATHS` is the one alias table, derived from the sections. A saved record (a
checkpoint's `train_config`, state.pt's) is written with flat keys, as every record so far was,
so old and new records are read alike, by this module and by the readers below it (the
dashboard, the probes), which see plain dicts.

Adding a field is one line in its section, with its bounds in the field's metadata (`int_field`,
`real_field`, `choice_field`, `bool_field` of smelt_interp.fields; `check_fields` checks them):
its flat key is its own name (a name no other section uses), its path `section.name`. A check
that needs another section's value goes in `TrainConfig.__post_init__`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smelt_interp.budget.matcher import D_HEAD_MULTIPLES
from smelt_interp.config import ARCHS, BASELINE, ModelConfig
from smelt_interp.data.assoc_recall import AssocRecallSpec
from smelt_interp.data.dyck import TASK_DYCK, DyckSpec
from smelt_interp.data.trigger import TriggerSpec
from smelt_interp.errors import ConfigError
from smelt_interp.fields import (
    bool_field,
    check_fields,
    check_int,
    choice_field,
    int_bounds,
    int_field,
    is_int,
    is_real,
    known_fields,
    plain,
    real_field,
    shown,
)
from smelt_interp.machine import GIB
from smelt_interp.train.schedule import DECAY_SHAPES, WSDSchedule

DEFAULT_MIN_CONTEXT = 512  # a model's max_seq_len when not given: this, or seq_len if longer
MAX_SEQ_LEN = int_bounds(ModelConfig, "max_seq_len")[1]

# Upper bounds of counts (in the fields' metadata) are far above any real run; they refuse a
# typo or a hostile value before it is used as a count.
MAX_STEPS = 10**9
MAX_BRANCHES = 64
MAX_EVAL_ROWS = 1024
PARALLEL = ("ddp", "fsdp")  # under torchrun: replicate (DDP) or shard (FSDP2)
DYCK_PACKING = ("cut", "whole")  # the example at a row's end: cut, or moved to a later row


def _check_weights(name: str, value: Any, what: str, allow_zero: bool = False) -> None:
    """A mapping of names to finite non-negative (or, without allow_zero, positive) numbers."""
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and is_real(v) and (v > 0 or (allow_zero and v == 0))
        for k, v in value.items()
    ):
        raise ConfigError(f"{name} maps {what}, got {shown(value)}")


def _check_section(section: Any, name: str) -> None:
    """Check a section's typed fields; messages name a field by its path, and a renamed one
    also by the flat key it had ("batch.size (batch_size)")."""
    old = {
        path.partition(".")[2]: key for key, path in RENAMED.items() if path.startswith(f"{name}.")
    }
    names = {field: f"{name}.{field} ({key})" for field, key in old.items()}
    check_fields(section, prefix=f"{name}.", names=names)


@dataclass
class CorpusConfig:
    """What the rows are drawn from: the domains' weights and the task generators' specs."""

    weights: dict[str, float] = field(default_factory=lambda: {"dyck": 1.0})  # flat key `data`
    paths: list[str] = field(default_factory=list)  # user text files/folders/JSONL
    # A folder of prepared token shards (python -m smelt_interp.data prepare): its domains are
    # training domains (weights in `weights`), read by train.shard_loader; "" for none.
    shards: str = ""
    dyck: DyckSpec = TASK_DYCK  # a mapping of DyckSpec fields is turned into one
    trigger: TriggerSpec = TriggerSpec()  # the trigger-task rows (data.trigger)
    assoc_recall: AssocRecallSpec = AssocRecallSpec()  # the associative-recall rows

    def __post_init__(self) -> None:
        self.dyck = DyckSpec.from_mapping(self.dyck)
        self.trigger = TriggerSpec.from_mapping(self.trigger)
        self.assoc_recall = AssocRecallSpec.from_mapping(self.assoc_recall)
        _check_weights("data", self.weights, "domains to non-negative weights", allow_zero=True)
        if not any(self.weights.values()):
            raise ConfigError(
                f"data must give at least one domain a positive weight: {shown(self.weights)}"
            )
        if not isinstance(self.shards, str):
            raise ConfigError(f"shards must be a folder path, got {shown(self.shards)}")
        if not isinstance(self.paths, list) or not all(
            isinstance(p, str) and p for p in self.paths
        ):
            raise ConfigError(f"data_paths must be a list of paths, got {shown(self.paths)}")


@dataclass
class BatchConfig:
    """The shape of a step: rows, their lengths and how they are filled."""

    seq_len: int = int_field(320, 2, MAX_SEQ_LEN)
    size: int = int_field(16, 1, 1 << 20)  # rows per micro-batch; flat key `batch_size`
    grad_accum: int = int_field(1, 1, 1 << 16)
    # Per-domain row lengths. When set, every micro-batch holds every domain, each in rows of
    # its own length and about its weight's share of size * seq_len tokens ("blended" steps;
    # TrainingData.batch_parts); domains not named use seq_len.
    row_len: dict[str, int] = field(default_factory=dict)
    doc_rows: bool = bool_field(False)  # corpus rows hold a slice of one document each, BOS first
    # "whole": no Dyck example is cut at a row's end (data.packing)
    dyck_packing: str = choice_field("cut", DYCK_PACKING)

    def __post_init__(self) -> None:
        _check_section(self, "batch")
        if not isinstance(self.row_len, dict):
            raise ConfigError(f"row_len must map domains to row lengths, got {shown(self.row_len)}")


@dataclass
class OptimConfig:
    """AdamW, the loss's auxiliary terms, gradient clipping and the weights' moving average."""

    lr: float = real_field(2e-3, 0.0, None, "()")
    arch_lr: dict[str, float] = field(default_factory=dict)  # per-architecture lr in a pair
    # A looped block's weights act on every visit, so one step moves what they compute about
    # n_loops times over: its parameters train at this multiple of `lr` (no effect unlooped).
    loop_lr_scale: float = real_field(1.0, 0.0, None, "()")
    weight_decay: float = real_field(0.1, 0.0, None, "[)")
    beta1: float = real_field(0.9, 0.0, 1.0, "[)")
    beta2: float = real_field(0.95, 0.0, 1.0, "[)")
    grad_clip: float = real_field(1.0, 0.0, None, "()")
    # > 0: the saved and evaluated model is an exponential moving average of the weights, this
    # much of the average kept per step (its window is about 1 / (1 - ema_decay) steps); the
    # trained weights stay in state.pt. 0: the trained weights themselves.
    ema_decay: float = real_field(0.0, 0.0, 1.0, "[)")
    load_balance_coef: float = real_field(0.01, 0.0, None, "[)")
    z_loss_coef: float = real_field(1e-3, 0.0, None, "[)")

    def __post_init__(self) -> None:
        _check_section(self, "optim")
        what = "baseline/smelt to positive learning rates"
        _check_weights("arch_lr", self.arch_lr, what)
        if set(self.arch_lr) - set(ARCHS):
            raise ConfigError(f"arch_lr maps {what}, got {shown(self.arch_lr)}")


@dataclass
class ScheduleConfig:
    """The learning rate's warmup-stable-decay schedule over the main horizon and its branches."""

    # a warmup longer than a horizon's stable phase is cut to it (see `TrainConfig.lr_schedule`)
    warmup_steps: int = int_field(50, 0, MAX_STEPS)
    steps: int = int_field(1000, 1, MAX_STEPS)  # the main horizon, in optimizer steps
    branches: list[int] = field(default_factory=list)  # extra horizons (decay branches)
    decay_fraction: float = real_field(0.2, 0.0, 1.0, "[]")
    decay_shape: str = choice_field("cosine", DECAY_SHAPES)
    min_lr_ratio: float = real_field(0.0, 0.0, 1.0, "[]")

    def __post_init__(self) -> None:
        _check_section(self, "schedule")
        if (
            not isinstance(self.branches, list)
            or len(self.branches) > MAX_BRANCHES
            or any(not is_int(b) or not 0 < b < self.steps for b in self.branches)
        ):
            raise ConfigError(
                f"branches must be a list of at most {MAX_BRANCHES} step counts between 0 and "
                f"steps ({self.steps}), got {shown(self.branches)}"
            )

    @property
    def horizons(self) -> list[int]:
        return sorted(set(self.branches) | {self.steps})


@dataclass
class EvalConfig:
    """The periodic evaluation (train/evaluators.py): how often, and on how much."""

    every: int = int_field(200, 1, MAX_STEPS)  # flat key `eval_every`
    # held-out rows per evaluation and domain (flat key `eval_rows`), capped at MAX_EVAL_ROWS: the
    # loss's standard error falls as 1/sqrt(rows) (1,024 rows already average ~10^5 tokens), while
    # an evaluation's cost grows with them and is paid every `every` steps (65,536 rows: minutes)
    rows: int = int_field(16, 1, MAX_EVAL_ROWS)
    dyck_n: int = int_field(200, 0, 1 << 20)  # Dyck examples scored; flat key `dyck_eval_n`
    dyck_demos: int = int_field(0, 0, 1024)  # demonstrations before each; `dyck_eval_demos`

    def __post_init__(self) -> None:
        _check_section(self, "eval")


@dataclass
class CheckpointConfig:
    """How often ckpt.pt and state.pt are written, and which early checkpoints are kept."""

    every: int = int_field(100, 1, MAX_STEPS)  # flat key `ckpt_every`
    # a copy of each periodic checkpoint up to this step is kept (run_folder.KEPT_DIR); 0: none;
    # flat key `keep_ckpts_until`
    keep_until: int = int_field(0, 0, MAX_STEPS)

    def __post_init__(self) -> None:
        _check_section(self, "checkpoint")


@dataclass
class RuntimeConfig:
    """Where and how the steps run: device, threads, compilation and data parallelism."""

    device: str = "auto"  # auto, cpu, cuda or cuda:N; whether it exists is the trainer's check
    compile: bool = bool_field(False)
    # ddp or fsdp; only used under torchrun (one process trains alone)
    parallel: str = choice_field("ddp", PARALLEL)
    threads: int = int_field(0, 0, 4096)  # 0: leave torch's default

    def __post_init__(self) -> None:
        _check_section(self, "runtime")
        device = self.device
        ok = isinstance(device, str) and (
            device in ("auto", "cpu", "cuda")
            or (device.startswith("cuda:") and device[5:].isdigit() and device[5:].isascii())
        )
        if not ok:
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {shown(device)}")


# The sections, by the attribute (and path head) that holds each.
SECTIONS: dict[str, type] = {
    "corpus": CorpusConfig,
    "batch": BatchConfig,
    "optim": OptimConfig,
    "schedule": ScheduleConfig,
    "eval": EvalConfig,
    "checkpoint": CheckpointConfig,
    "runtime": RuntimeConfig,
}
TOP_LEVEL = ("model", "arch", "seed", "d_head_multiple")  # TrainConfig's own fields

# The flat keys that name a field of another name: every other section field's flat key is its
# own name.
RENAMED: dict[str, str] = {
    "data": "corpus.weights",
    "data_paths": "corpus.paths",
    "batch_size": "batch.size",
    "eval_every": "eval.every",
    "eval_rows": "eval.rows",
    "dyck_eval_n": "eval.dyck_n",
    "dyck_eval_demos": "eval.dyck_demos",
    "ckpt_every": "checkpoint.every",
    "keep_ckpts_until": "checkpoint.keep_until",
}


def _flat_paths() -> dict[str, tuple[str, str]]:
    """Every section field's flat key and its (section, field) path: the alias table."""
    renamed = {tuple(path.split(".")): key for key, path in RENAMED.items()}
    paths: dict[str, tuple[str, str]] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            key = renamed.get((section, f.name), f.name)
            if key in paths or key in TOP_LEVEL or key in SECTIONS:
                raise AssertionError(f"flat key {key} names two training fields; add to RENAMED")
            paths[key] = (section, f.name)
    return paths


FLAT_PATHS = _flat_paths()


def _has_sub_fields(cls: type, name: str) -> bool:
    """Whether a field holds a mapping or a spec, whose entries `path.sub=value` may set."""
    f = cls.__dataclass_fields__[name]
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return isinstance(default, Mapping) or dataclasses.is_dataclass(default)


def _unknown(key: str) -> ConfigError:
    """The error for a key that names no field, with the path when it is a section field's."""
    sections = [s for s, cls in SECTIONS.items() if key in cls.__dataclass_fields__]
    hint = f"; did you mean {' or '.join(f'{s}.{key}' for s in sections)}?" if sections else ""
    return ConfigError(f"unknown training field {shown(key)}{hint}")


def _set(out: dict[str, Any], path: tuple[str, ...], sub: str, value: Any, key: str) -> None:
    """Set the field at `path` of the sectioned data `out` to `value`, or with `sub` one entry
    of it (a mapping field's key, a spec's or the model's field)."""
    if len(path) == 1:
        container, owner = out, TrainConfig
    else:
        section = out.get(path[0])
        container = out[path[0]] = dict(section) if isinstance(section, Mapping) else {}
        owner = SECTIONS[path[0]]
    name = path[-1]
    if name not in owner.__dataclass_fields__:
        raise ConfigError(
            f"{path[0]} has no field {shown(name)}; it has {', '.join(owner.__dataclass_fields__)}"
        )
    if not sub:
        container[name] = value
        return
    current = plain(container.get(name, {}))
    if not _has_sub_fields(owner, name) or not isinstance(current, Mapping):
        raise ConfigError(f"{key.partition('.')[0]} has no sub-fields (got {shown(key)})")
    container[name] = {**current, sub: value}


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Plain config data with `key=value` overrides applied, as sectioned data (top-level fields
    and one mapping per section given). A key is a path (`optim.lr`, `corpus.dyck.p_open`,
    `model.d_model`) or a flat key (`lr`, `dyck.p_open`, `data.code`); a section given whole
    (`"optim": {"lr": 1e-3}`) sets the fields it names. A sub-field of a mapping `data` lacks
    starts from that spec's own defaults."""
    out: dict[str, Any] = {}
    for items in (data, overrides):
        for key, value in items.items():
            if not isinstance(key, str):
                raise ConfigError(f"unknown training field {shown(key)}")
            head, _, rest = key.partition(".")
            if head in SECTIONS:
                if rest:
                    name, _, sub = rest.partition(".")
                    _set(out, (head, name), sub, value, key)
                elif isinstance(value, Mapping):
                    for name, entry in value.items():
                        _set(out, (head, str(name)), "", entry, f"{head}.{name}")
                else:
                    raise ConfigError(f"{head} is a section: give a mapping of its fields")
            elif head in TOP_LEVEL:
                _set(out, (head,), rest, value, key)
            elif head in FLAT_PATHS:
                _set(out, FLAT_PATHS[head], rest, value, key)
            else:
                raise _unknown(head)
    return out


@dataclass
class TrainConfig:
    """Everything a run needs. `model` is the Baseline's shape; an `arch="smelt"` run trains the
    SMELT config the budget matcher finds for it (see `model_config`)."""

    model: ModelConfig = field(default_factory=ModelConfig.baseline)
    arch: str = choice_field(BASELINE, ARCHS)  # smelt: matched from the baseline shape
    seed: int = int_field(0, 0, 2**31 - 1)
    d_head_multiple: int = choice_field(2, D_HEAD_MULTIPLES)  # SMELT's head width (8 on GPUs)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelConfig) or self.model.is_looped:
            raise ConfigError(
                "model must be an unlooped ModelConfig (the Baseline's shape), "
                f"got {shown(self.model)}"
            )
        for name, cls in SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(
                    f"{name} must be a {cls.__name__}, got {shown(getattr(self, name))}"
                )
        check_fields(self)
        if self.batch.seq_len > self.model.max_seq_len:
            raise ConfigError(
                f"seq_len ({self.batch.seq_len}) exceeds the model's max_seq_len "
                f"({self.model.max_seq_len}); raise model.max_seq_len"
            )
        for domain, length in self.batch.row_len.items():
            if domain not in self.corpus.weights:
                raise ConfigError(
                    f"row_len names domain {shown(domain)}, which data does not have "
                    f"({', '.join(shown(d) for d in self.corpus.weights)})"
                )
            check_int(f"row_len[{shown(domain)}]", length, 2, self.model.max_seq_len)
        for horizon in self.schedule.horizons:
            self.lr_schedule(horizon)

    def activation_bytes(self) -> int:
        """A lower bound of one micro-batch's training memory beyond the weights: float32
        logits, their log-softmax and gradient, and four d_model vectors per token per layer."""
        per_token = 4 * (3 * self.model.vocab_size + 4 * self.model.d_model * self.model.n_layers)
        return self.batch.size * self.batch.seq_len * per_token

    def check_memory(self, limit: int) -> None:
        """Raise a ConfigError, before anything is allocated, if one micro-batch needs more
        than `limit` bytes (the training device's memory)."""
        need = self.activation_bytes()
        if need > limit:
            raise ConfigError(
                f"batch_size {self.batch.size} x seq_len {self.batch.seq_len} needs at least "
                f"{need / GIB:,.1f} GiB for activations, more than the {limit / GIB:,.1f} GiB "
                f"of the training device; lower batch_size (grad_accum keeps the tokens per step)"
            )

    def lr_schedule(self, horizon: int) -> WSDSchedule:
        """The learning rates of one horizon. A warmup longer than the horizon's stable phase
        is cut to it: warmup ends where the decay starts, so a short run still decays."""
        s = self.schedule
        decay_start = horizon - int(round(s.decay_fraction * horizon))
        return WSDSchedule(
            self.optim.lr,
            min(s.warmup_steps, decay_start),
            horizon,
            s.decay_fraction,
            s.decay_shape,
            s.min_lr_ratio,
        )

    def model_config(self) -> ModelConfig:
        """The model to train: the Baseline shape, or for arch 'smelt' the SMELT config the budget
        matcher finds for it (the matcher runs here, when a model is built, not on validation)."""
        if self.arch == BASELINE:
            return self.model
        from smelt_interp.budget import match_smelt

        return match_smelt(
            self.model, seq_len=self.batch.seq_len, d_head_multiple=self.d_head_multiple
        ).smelt

    @property
    def tokens_per_step(self) -> int:
        return self.batch.seq_len * self.batch.size * self.batch.grad_accum

    def to_dict(self) -> dict[str, Any]:
        """The saved record: plain JSON-ready data with flat keys (see the module's docstring),
        the model and the specs as dicts of their fields, as checkpoints save it."""
        record = {name: plain(getattr(self, name)) for name in TOP_LEVEL}
        for key, (section, name) in FLAT_PATHS.items():
            record[key] = plain(getattr(getattr(self, section), name))
        return record

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build from plain data: a saved record, a preset, a JSON config file, in flat keys,
        paths or sections (see apply_overrides). `model` is a dict of ModelConfig fields for the
        Baseline; a missing `max_seq_len` is 512, or `seq_len` when that is longer."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"a training config must be a mapping, got {type(data).__name__}")
        fields = apply_overrides(data, {})
        sections = {name: SECTIONS[name](**fields.pop(name, {})) for name in SECTIONS}
        model = fields.get("model", {})
        if isinstance(model, Mapping):
            context = max(DEFAULT_MIN_CONTEXT, sections["batch"].seq_len)
            model = known_fields(ModelConfig, model, "model")
            fields["model"] = ModelConfig.baseline(**{"max_seq_len": context, **model})
        return cls(**fields, **sections)

    def with_overrides(self, overrides: Mapping[str, Any]) -> TrainConfig:
        """A copy with `key=value` overrides applied (see apply_overrides)."""
        return TrainConfig.from_dict(apply_overrides(self.to_dict(), overrides))

    def same_run(self, other: TrainConfig) -> bool:
        """Whether the two configs train the same model: equal in every field but `arch_lr`,
        which train.trainer.pair_configs has already folded into each model's `lr`: a new SMELT
        rate in a pair preset leaves the pair's Baseline runs resumable and reusable."""

        def unpaired(cfg: TrainConfig) -> TrainConfig:
            return dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, arch_lr={}))

        return unpaired(self) == unpaired(other)
