"""The sections of a run's TrainConfig (train.config): one dataclass per component (corpus,
batch, optim, schedule, eval, checkpoint, runtime, log, matcher), each field with its bounds in
its metadata (smelt_interp.fields), each section checking its own fields on construction.
`RENAMED` holds the few fields whose flat key (train.config's spellings) is not their own name,
which the sections' messages name beside the path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from smelt_interp.budget.matcher import MAX_STEP
from smelt_interp.config import ARCHS, ModelConfig
from smelt_interp.data.assoc_recall import AssocRecallSpec
from smelt_interp.data.computed_recall import ComputedRecallSpec
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
    real_field,
    shown,
)
from smelt_interp.train.schedule import DECAY_SHAPES

MAX_SEQ_LEN = int_bounds(ModelConfig, "max_seq_len")[1]

# Upper bounds of counts (in the fields' metadata) are far above any real run; they refuse a
# typo or a hostile value before it is used as a count.
MAX_STEPS = 10**9
MAX_BRANCHES = 64
MAX_EVAL_ROWS = 1024
PARALLEL = ("ddp", "fsdp")  # under torchrun: replicate (DDP) or shard (FSDP2)
DYCK_PACKING = ("cut", "whole")  # the example at a row's end: cut, or moved to a later row
WANDB_MODES = ("offline", "online")  # offline: a local run folder, uploaded by `wandb sync`


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
    computed_recall: ComputedRecallSpec = ComputedRecallSpec()  # the computed-class recall rows

    def __post_init__(self) -> None:
        self.dyck = DyckSpec.from_mapping(self.dyck)
        self.trigger = TriggerSpec.from_mapping(self.trigger)
        self.assoc_recall = AssocRecallSpec.from_mapping(self.assoc_recall)
        self.computed_recall = ComputedRecallSpec.from_mapping(self.computed_recall)
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


@dataclass
class LogConfig:
    """Where the training curves go beside metrics.jsonl (train.curve_sinks): a TensorBoard
    folder and a W&B mode, both off by default. It changes nothing a run trains, so a resume
    may turn either on or off (TrainConfig.same_run leaves it out)."""

    tensorboard: str | None = None  # a folder; each run writes to its own subfolder of it
    wandb: str | None = None  # one of WANDB_MODES

    def __post_init__(self) -> None:
        folder = self.tensorboard
        if folder is not None and (not isinstance(folder, str) or not folder):
            raise ConfigError(f"log.tensorboard must be a folder path or null, got {shown(folder)}")
        if self.wandb is not None and self.wandb not in WANDB_MODES:
            modes = " or ".join(WANDB_MODES)
            raise ConfigError(f"log.wandb must be {modes} (or null: off), got {shown(self.wandb)}")


@dataclass
class MatcherConfig:
    """How the budget matcher (budget.match_smelt) shapes an arch-smelt run's model from the
    Baseline: the step of SMELT's d_model (null: the matcher's own, 16 from a Baseline d_model of
    128, else 8) and of its d_expert (the matcher's default 8). Steps of 64 or 128 keep the
    GEMMs on whole tiles (budget.kernel, the paper-200m-k64 preset). SMELT's head width is the
    top-level `d_head_multiple`, where saved records already hold it."""

    width_step: int | None = None
    expert_step: int = int_field(8, 1, MAX_STEP)

    def __post_init__(self) -> None:
        _check_section(self, "matcher")
        if self.width_step is not None:
            check_int("matcher.width_step", self.width_step, 1, MAX_STEP)


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
