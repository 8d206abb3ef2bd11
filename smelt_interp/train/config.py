"""Training configuration: `TrainConfig`, the Baseline's ModelConfig and the run's identity (arch,
seed) beside one section dataclass per component (corpus, batch, optim, schedule, eval,
checkpoint, runtime, log), built from plain data (a preset, a JSON file, `--set key=value`) and
written back as plain data for checkpoints.

Spellings. A field is named by its path, `optim.lr` or `corpus.dyck.p_open`, or by its flat key,
the one name it had before the sections: `lr`, `dyck.p_open`, `data.code` (a domain's weight),
`batch_size`. Flat keys are every section field's own name, except the few renamed fields in
`RENAMED`; `FLAT_PATHS` is the one alias table, derived from the sections, and
`resolve_overrides` the one place a key is translated to its field. A saved record (a
checkpoint's `train_config`, state.pt's) is written with flat keys, as every record so far was,
so old and new records are read alike, by this module and by the readers below it (the
dashboard, the probes), which see plain dicts. A section added after that (`PATH_ONLY`: `log`,
`matcher`) has no flat keys, and a record holds it as a mapping of its fields off their
defaults, only when there are any, so a record of a run that leaves it at its defaults is as it
was. Likewise a task spec added after that (`LATER_SPECS`: `computed_recall`) is written only
when the run trains its domain (the spec's key is the domain's name) or sets it off its defaults.

Plain data is read at the edges only (`TrainConfig.from_dict`: a preset, a file, a saved
record) and written there (`to_dict`). A built config is changed typed: `with_overrides` for
`key=value` overrides, `dataclasses.replace` in code; neither goes through a dict.

Adding a field is one line in its section, with its bounds in the field's metadata (`int_field`,
`real_field`, `choice_field`, `bool_field` of smelt_interp.fields; `check_fields` checks them):
its flat key is its own name (a name no other section uses), its path `section.name`. A check
that needs another section's value goes in `TrainConfig.__post_init__`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from smelt_interp.budget.matcher import D_HEAD_MULTIPLES
from smelt_interp.config import ARCHS, BASELINE, UNLOOPED, ModelConfig
from smelt_interp.errors import ConfigError
from smelt_interp.fields import (
    check_fields,
    check_int,
    choice_field,
    int_field,
    known_fields,
    plain,
    replace_fields,
    shown,
)
from smelt_interp.machine import GIB
from smelt_interp.model.kernels import KernelOptions
from smelt_interp.train.schedule import WSDSchedule
from smelt_interp.train.sections import (
    RENAMED,
    BatchConfig,
    CheckpointConfig,
    CorpusConfig,
    EvalConfig,
    LogConfig,
    MatcherConfig,
    OptimConfig,
    RuntimeConfig,
    ScheduleConfig,
)

DEFAULT_MIN_CONTEXT = 512  # a model's max_seq_len when not given: this, or seq_len if longer
# The sections, by the attribute (and path head) that holds each (train.sections).
SECTIONS: dict[str, type] = {
    "corpus": CorpusConfig,
    "batch": BatchConfig,
    "optim": OptimConfig,
    "schedule": ScheduleConfig,
    "eval": EvalConfig,
    "checkpoint": CheckpointConfig,
    "runtime": RuntimeConfig,
    "log": LogConfig,
    "kernels": KernelOptions,  # model.kernels: switches of how, not what, the model computes
    "matcher": MatcherConfig,
}
PATH_ONLY = ("log", "matcher", "kernels")  # sections without flat keys (see the module's docstring)
TOP_LEVEL = ("model", "arch", "seed", "d_head_multiple")  # TrainConfig's own fields
# Specs whose flat key a record holds only when the run trains that domain or changes the spec
LATER_SPECS = ("computed_recall",)


def _flat_paths() -> dict[str, tuple[str, str]]:
    """Every section field's flat key and its (section, field) path: the alias table."""
    renamed = {tuple(path.split(".")): key for key, path in RENAMED.items()}
    paths: dict[str, tuple[str, str]] = {}
    for section, cls in SECTIONS.items():
        if section in PATH_ONLY:
            continue
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


@dataclass(frozen=True)
class Override:
    """One `key=value` resolved to the field it sets: `path` is ("model",) or a (section,
    field) pair, `sub` the entry of that field a longer key names ("" for the whole field: a
    mapping field's key, a spec's or the model's field), `key` the key as the user spelled it."""

    path: tuple[str, ...]
    sub: str
    value: Any
    key: str


def _override(path: tuple[str, ...], sub: str, value: Any, key: str) -> Override:
    """The override of `path`, refused when the field does not exist or has no sub-fields."""
    owner = TrainConfig if len(path) == 1 else SECTIONS[path[0]]
    name = path[-1]
    if name not in owner.__dataclass_fields__:
        raise ConfigError(
            f"{path[0]} has no field {shown(name)}; it has {', '.join(owner.__dataclass_fields__)}"
        )
    if sub and not _has_sub_fields(owner, name):
        raise _no_sub_fields(key)
    return Override(path, sub, value, key)


def _no_sub_fields(key: str) -> ConfigError:
    return ConfigError(f"{key.partition('.')[0]} has no sub-fields (got {shown(key)})")


def resolve_overrides(overrides: Mapping[str, Any]) -> Iterator[Override]:
    """Each `key=value` of `overrides`, in order, resolved to the field it sets: the one place
    flat keys and paths are translated. A key is a path (`optim.lr`, `corpus.dyck.p_open`,
    `model.d_model`) or a flat key (`lr`, `dyck.p_open`, `data.code`); a section given whole
    (`"optim": {"lr": 1e-3}`) sets the fields it names."""
    for key, value in overrides.items():
        if not isinstance(key, str):
            raise ConfigError(f"unknown training field {shown(key)}")
        head, _, rest = key.partition(".")
        if head in SECTIONS:
            if rest:
                name, _, sub = rest.partition(".")
                yield _override((head, name), sub, value, key)
            elif isinstance(value, Mapping):
                for name, entry in value.items():
                    yield _override((head, str(name)), "", entry, f"{head}.{name}")
            else:
                raise ConfigError(f"{head} is a section: give a mapping of its fields")
        elif head in TOP_LEVEL:
            yield _override((head,), rest, value, key)
        elif head in FLAT_PATHS:
            yield _override(FLAT_PATHS[head], rest, value, key)
        else:
            raise _unknown(head)


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Plain config data with `key=value` overrides applied, as sectioned data (top-level fields
    and one mapping per section given; see resolve_overrides). A sub-field of a mapping `data`
    lacks starts from that spec's own defaults. This reads plain data (a preset, a file, a saved
    record); a built config takes overrides with `TrainConfig.with_overrides`."""
    out: dict[str, Any] = {}
    for items in (data, overrides):
        for o in resolve_overrides(items):
            container = out if len(o.path) == 1 else out.setdefault(o.path[0], {})
            name = o.path[-1]
            if not o.sub:
                container[name] = o.value
                continue
            current = plain(container.get(name, {}))
            if not isinstance(current, Mapping):
                raise _no_sub_fields(o.key)
            container[name] = {**current, o.sub: o.value}
    return out


@dataclass(frozen=True)
class _Edit:
    """Sub-field changes waiting to be applied to a typed value (a spec or the model)."""

    base: Any
    changes: dict[str, Any]


def _edited(current: Any, o: Override) -> Any:
    """`current`, a field's typed value or its pending one, with the override `o.sub` applied:
    a mapping gets the entry, a spec or the model collects it as an edit of its fields."""
    if isinstance(current, _Edit):
        return _Edit(current.base, {**current.changes, o.sub: o.value})
    if dataclasses.is_dataclass(current) and not isinstance(current, type):
        return _Edit(current, {o.sub: o.value})
    if isinstance(current, Mapping):
        return {**current, o.sub: o.value}
    raise _no_sub_fields(o.key)


def _baseline_model(value: Any, seq_len: int) -> Any:
    """The Baseline's shape from a `model` value: a mapping of ModelConfig fields (a missing
    `max_seq_len` is DEFAULT_MIN_CONTEXT, or `seq_len` when longer), edits of the current
    shape, or anything else as given (TrainConfig's own check refuses what is no ModelConfig).
    Either way the shape is unlooped, as `ModelConfig.baseline` makes it."""
    if isinstance(value, _Edit):
        changes = known_fields(ModelConfig, value.changes, "model")
        return dataclasses.replace(value.base, **{**changes, **UNLOOPED})
    if isinstance(value, Mapping):
        context = max(DEFAULT_MIN_CONTEXT, seq_len)
        return ModelConfig.baseline(
            **{"max_seq_len": context, **known_fields(ModelConfig, value, "model")}
        )
    return value


def _spec_value(value: Any, name: str) -> Any:
    """A section field's new value: edits of a spec applied to it (worded as the spec's own
    `from_mapping` words errors, under the field's name), anything else as given."""
    return replace_fields(value.base, value.changes, name) if isinstance(value, _Edit) else value


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
    log: LogConfig = field(default_factory=LogConfig)
    kernels: KernelOptions = field(default_factory=KernelOptions)
    matcher: MatcherConfig = field(default_factory=MatcherConfig)

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
            self.model,
            seq_len=self.batch.seq_len,
            d_head_multiple=self.d_head_multiple,
            width_step=self.matcher.width_step,
            expert_step=self.matcher.expert_step,
        ).smelt

    @property
    def tokens_per_step(self) -> int:
        return self.batch.seq_len * self.batch.size * self.batch.grad_accum

    def to_dict(self) -> dict[str, Any]:
        """The saved record: plain JSON-ready data with flat keys (see the module's docstring),
        the model and the specs as dicts of their fields, as checkpoints save it."""
        record = {name: plain(getattr(self, name)) for name in TOP_LEVEL}
        for key, (section, name) in FLAT_PATHS.items():
            value = plain(getattr(getattr(self, section), name))
            if key in LATER_SPECS and not self.corpus.weights.get(key):
                if value == plain(getattr(SECTIONS[section](), name)):
                    continue
            record[key] = value
        for name in PATH_ONLY:  # only the fields off their defaults, and no key without any
            default = plain(SECTIONS[name]())
            changed = {k: v for k, v in plain(getattr(self, name)).items() if v != default[k]}
            if changed:
                record[name] = changed
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
        if isinstance(fields.get("model", {}), Mapping):
            fields["model"] = _baseline_model(fields.get("model", {}), sections["batch"].seq_len)
        return cls(**fields, **sections)

    def with_overrides(self, overrides: Mapping[str, Any]) -> TrainConfig:
        """A copy with `key=value` overrides applied (keys as resolve_overrides reads them; a
        sub-field override edits the field's current value). The copy is built from this
        config's typed fields, never through plain data: each changed section is replaced
        (`dataclasses.replace`, which checks it again, its fields in order), then the model,
        then the copy itself, as `from_dict` builds them."""
        pending: dict[tuple[str, ...], Any] = {}
        for o in resolve_overrides(overrides):
            if o.sub:
                current = pending[o.path] if o.path in pending else self._field(o.path)
                pending[o.path] = _edited(current, o)
            else:
                pending[o.path] = o.value
        sections = {}
        for name in SECTIONS:
            section = getattr(self, name)
            changes = {
                f.name: _spec_value(pending[name, f.name], f.name)
                for f in dataclasses.fields(section)
                if (name, f.name) in pending
            }
            if changes:
                sections[name] = dataclasses.replace(section, **changes)
        top = {path[0]: value for path, value in pending.items() if len(path) == 1}
        if "model" in top:
            seq_len = sections.get("batch", self.batch).seq_len
            top["model"] = _baseline_model(top["model"], seq_len)
        return dataclasses.replace(self, **top, **sections)

    def _field(self, path: tuple[str, ...]) -> Any:
        """The value at a path: ("model",) or (section, field)."""
        value = getattr(self, path[0])
        return getattr(value, path[1]) if len(path) == 2 else value

    def same_run(self, other: TrainConfig) -> bool:
        """Whether the two configs train the same model: equal in every field but `arch_lr`,
        which train.trainer.pair_configs has already folded into each model's `lr`: a new SMELT
        rate in a pair preset leaves the pair's Baseline runs resumable and reusable; and `log`,
        where the curves go, which trains nothing (a resume may turn TensorBoard on)."""

        def unpaired(cfg: TrainConfig) -> TrainConfig:
            optim = dataclasses.replace(cfg.optim, arch_lr={})
            return dataclasses.replace(cfg, optim=optim, log=LogConfig())

        return unpaired(self) == unpaired(other)
