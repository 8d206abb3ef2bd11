"""The training curves in TensorBoard and W&B beside metrics.jsonl (`--set log.tensorboard=DIR`,
`--set log.wandb=offline|online`): every record the trainer logs is forwarded to the loggers the
config turns on, as the same scalars under the same names at the record's step (`scalars`). Only
rank 0 writes. Each package is imported only when asked for; a missing one is a one-line
ConfigError naming the extra that installs it.

A resumed run continues the same curves. TensorBoard writes to the same folder and hides the
events past the step resumed from, as metrics.jsonl drops those records (the run logs them
again). W&B continues the run whose id the run folder keeps (WANDB_ID_FILE); it cannot drop
steps, so there the steps redone after a crash show twice. Its x axis is the record's step (a
`define_metric` step metric), not W&B's own counter, which would drop every record at a step
below one already logged: the main run's steps after a decay branch, a resume's redone steps."""

from __future__ import annotations

import hashlib
import re
import secrets
import string
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from smelt_interp.errors import ConfigError
from smelt_interp.fields import is_int
from smelt_interp.files import atomic_write_text, read_input_bytes

if TYPE_CHECKING:
    from smelt_interp.train.sections import LogConfig

STEP = "step"  # the record field that is the curves' x axis, not a curve of its own
WANDB_PROJECT = "smelt-interp"
WANDB_ID_FILE = "wandb_id.txt"  # in the run folder: the W&B run a resume continues
_WANDB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what W&B accepts as a run id


def scalars(record: Mapping[str, Any]) -> tuple[int, dict[str, float]] | None:
    """The record's step and its scalars: every number in it (not a bool) but the step, under
    its own name; None for a record without an integer step. A decay branch's record (it has a
    `branch` field, the branch's horizon) puts its scalars under `branch-H/`: its steps repeat
    the main run's, and one curve holding both would run back over itself."""
    step = record.get(STEP)
    if not is_int(step):
        return None
    prefix = f"branch-{record['branch']}/" if "branch" in record else ""
    values = {
        f"{prefix}{name}": value
        for name, value in record.items()
        if name not in (STEP, "branch") and (is_int(value) or isinstance(value, float))
    }
    return step, values


class CurveSinks:
    """The external loggers of one run: `write` each metrics record, `close` when it ends.
    With neither logger on (the defaults, and every rank but 0) both do nothing."""

    def __init__(self, tensorboard: Any = None, wandb_run: Any = None) -> None:
        self.tensorboard = tensorboard  # a torch.utils.tensorboard.SummaryWriter
        self.wandb_run = wandb_run  # a wandb Run

    def write(self, record: Mapping[str, Any]) -> None:
        parsed = scalars(record)
        if parsed is None or not parsed[1]:
            return
        step, values = parsed
        if self.tensorboard is not None:
            for name, value in values.items():
                self.tensorboard.add_scalar(name, value, global_step=step)
        if self.wandb_run is not None:
            self.wandb_run.log({STEP: step, **values})

    def close(self) -> None:
        """Flush and close each logger (a second close does nothing)."""
        tensorboard, wandb_run = self.tensorboard, self.wandb_run
        self.tensorboard = self.wandb_run = None
        try:
            if tensorboard is not None:
                tensorboard.close()
        finally:
            if wandb_run is not None:
                wandb_run.finish()


NO_SINKS = CurveSinks()  # holds no logger, so nothing it does changes it


def run_name(out_dir: str | Path) -> str:
    """A run's name in both loggers, unique per output folder: the folder above the run's,
    tagged with 6 hex digits of its full path, then the run's own, `dyck-pair-1a2b3c/baseline`
    or `size0-4d5e6f/smelt`. A pair's or a ladder's runs in one TensorBoard folder stay
    apart, and so do two `--out` folders of one name (`a/tiny`, `b/tiny`), whose curves would
    otherwise fill one folder with both runs' values at each step."""
    path = Path(out_dir).resolve()
    tag = hashlib.sha256(str(path.parent).encode("utf-8", "surrogateescape")).hexdigest()[:6]
    return f"{path.parent.name or 'root'}-{tag}/{path.name}"


def open_sinks(
    log: LogConfig,
    out_dir: str | Path,
    name: str,
    resume_step: int | None,
    is_main: bool,
    config: Mapping[str, Any] | None = None,
) -> CurveSinks:
    """The loggers `log` turns on, for the run in `out_dir` called `name` (see run_name), which
    resumes from `resume_step` (None: a fresh run); `config`, the run's saved record, goes to
    W&B as the run's config. Off rank 0 (`is_main` false) nothing is opened or written."""
    if not is_main or (log.tensorboard is None and log.wandb is None):
        return CurveSinks()
    sinks = CurveSinks()
    try:
        if log.tensorboard is not None:
            sinks.tensorboard = _tensorboard(Path(log.tensorboard) / name, resume_step)
        if log.wandb is not None:
            sinks.wandb_run = _wandb(log.wandb, Path(out_dir), name, resume_step, config)
    except BaseException:
        sinks.close()  # the logger opened first, when the second fails
        raise
    return sinks


def _missing(key: str, extra: str) -> ConfigError:
    return ConfigError(f"{key} needs the {extra} package: pip install 'smelt-interp[{extra}]'")


def _tensorboard(folder: Path, resume_step: int | None) -> Any:
    """A SummaryWriter into `folder`. Resumed, it purges the folder's events from the step
    after `resume_step` on: metrics.jsonl keeps the records up to that step, and the resumed
    run logs the later ones again."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch's module raises it too when the tensorboard package is missing
        raise _missing("log.tensorboard", "tensorboard") from None
    purge = None if resume_step is None else resume_step + 1
    return SummaryWriter(log_dir=str(folder), purge_step=purge)


def _wandb(
    mode: str, out_dir: Path, name: str, resume_step: int | None, config: Mapping[str, Any] | None
) -> Any:
    """A W&B run in `mode`, its local files under `out_dir/wandb`: the run whose id
    WANDB_ID_FILE holds when resuming, else a new one whose id is written there."""
    try:
        import wandb
    except ImportError:
        raise _missing("log.wandb", "wandb") from None
    id_file = out_dir / WANDB_ID_FILE
    run_id = _saved_id(id_file) if resume_step is not None else None
    if run_id is None:
        alphabet = string.ascii_lowercase + string.digits  # W&B's own ids' alphabet
        run_id = "".join(secrets.choice(alphabet) for _ in range(8))
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(id_file, run_id + "\n")
    try:
        run = wandb.init(
            project=WANDB_PROJECT,
            id=run_id,
            resume="allow",
            mode=mode,
            dir=str(out_dir),
            name=name,
            config=dict(config or {}),
        )
    except wandb.errors.Error as exc:  # no API key online, a refused id: W&B's own words
        raise ConfigError(f"log.wandb={mode}: {' '.join(str(exc).split())}") from None
    run.define_metric(STEP)
    run.define_metric("*", step_metric=STEP)
    return run


def _saved_id(path: Path) -> str | None:
    """The W&B run id a run folder keeps, None when there is none; anything else there is a
    one-line error, not a new run under the old curves' name."""
    if not path.exists():
        return None
    text = read_input_bytes(path, 256, ConfigError, "W&B run id file").decode("ascii", "replace")
    if not _WANDB_ID.fullmatch(text.strip()):
        raise ConfigError(f"{path} holds no W&B run id; remove it to start a new W&B run")
    return text.strip()
