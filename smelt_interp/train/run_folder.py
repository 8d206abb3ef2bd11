"""A training run's folder: refuse a path that cannot be a folder, hold an exclusive lock for
the run (`fcntl.flock` on `<folder>/.lock`; the kernel releases it when the process ends, so a
killed run never leaves the folder stuck), remove the temp files that an atomic write killed
mid-save left behind, read a saved training state as the input it is (`load_training_state`),
and keep an earlier run's files until a new run in the same folder has saved (`RunLog`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from smelt_interp.errors import CheckpointError, RunFolderError
from smelt_interp.files import open_input
from smelt_interp.machine import memory_limit_bytes
from smelt_interp.provenance import CKPT_FILE

# The files of a run folder, named here (the checkpoint and the metrics log in
# provenance.py, which every part that asks where a checkpoint came from reads).
LOCK_FILE = ".lock"
STATE_FILE = "state.pt"  # optimizer, data and RNG state for --resume
JOB_FILE = "job.json"  # a queued or launched background job's record
LOG_FILE = "train.log"  # the trainer's output when a background job launched it
# Early checkpoints a run keeps (TrainConfig.keep_ckpts_until): copies of ckpt.pt at periodic
# steps, in a subfolder and under a name other than ckpt.pt, so that nothing that looks for run
# folders (the dashboard's registry, the seeds command) takes one for a run of its own.
KEPT_DIR = "early"
KEPT_PATTERN = re.compile(r"^ckpt-(\d{6,})\.pt$")


def kept_ckpt_name(step: int) -> str:
    """The file name of the early checkpoint kept at `step` (zero-padded, so names sort)."""
    return f"ckpt-{step:06d}.pt"


def kept_checkpoints(folder: str | os.PathLike[str]) -> dict[int, Path]:
    """{step: path} of the early checkpoints a run folder holds, by step."""
    place = Path(folder) / KEPT_DIR
    if not place.is_dir():
        return {}
    found = {}
    for item in place.iterdir():
        match = KEPT_PATTERN.match(item.name)
        if match and item.is_file():
            found[int(match.group(1))] = item
    return dict(sorted(found.items()))


def check_folder_path(path: str | os.PathLike[str]) -> Path:
    """`path`, if it is a folder or can be made one: not a plain file, not under one."""
    path = Path(path)
    for place in (path, *path.parents):
        if place.is_dir():
            return path
        if place.exists() or place.is_symlink():
            where = "is" if place == path else f"is under {place}, which is"
            raise RunFolderError(f"{path} {where} a file, not a folder; choose another --out")
    return path


def remove_stale_temps(folder: Path, names: tuple[str, ...]) -> list[Path]:
    """Delete the temp files (`.<name>.<random>.tmp`, see smelt_interp.files) of `names` in
    `folder` and its subfolders one level down (decay branches, kept early checkpoints); the
    removed paths."""
    alternatives = [re.escape(n) for n in names]
    if CKPT_FILE in names:  # a run's checkpoints: its kept early ones too (in KEPT_DIR)
        alternatives.append(KEPT_PATTERN.pattern[1:-1])
    pattern = re.compile(r"^\.(?:" + "|".join(alternatives) + r")\.[A-Za-z0-9_]+\.tmp$")
    removed = []
    for place in (folder, *(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())):
        for item in place.iterdir():
            if pattern.match(item.name) and item.is_file() and not item.is_symlink():
                with contextlib.suppress(FileNotFoundError):
                    item.unlink()
                    removed.append(item)
    return removed


class RunFolder:
    """`with RunFolder(path, temp_names):` creates the folder, holds its lock for the block and
    clears stale temp files of `temp_names`; a folder another run holds is a RunFolderError."""

    def __init__(self, path: str | os.PathLike[str], temp_names: tuple[str, ...] = ()) -> None:
        self.path = Path(path)
        self.temp_names = temp_names
        self._fh: IO[str] | None = None

    def __enter__(self) -> RunFolder:
        check_folder_path(self.path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fh = _open_lock(self.path / LOCK_FILE)  # held until __exit__
        except OSError as exc:
            raise RunFolderError(f"{self.path}: cannot use as a run folder ({exc})") from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise RunFolderError(
                f"{self.path} is in use by another training run (it holds "
                f"{self.path / LOCK_FILE}); wait for it to finish or choose another --out"
            ) from None
        self._fh = fh
        for name in self.temp_names:  # a run's own files: never a FIFO or device to block on
            place = self.path / name
            if place.exists() and not place.is_file():
                self.__exit__(None, None, None)
                raise RunFolderError(
                    f"{place}: not a regular file; move it away or choose another --out"
                )
        if self.temp_names:
            remove_stale_temps(self.path, self.temp_names)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fh is not None:
            if kind is not None and self.temp_names:  # a failed run leaves no pending log
                remove_stale_temps(self.path, self.temp_names)
            self._fh.close()  # closing the file releases the lock
            self._fh = None


def _open_lock(path: Path) -> IO[str]:
    """The lock file opened for appending without blocking (a FIFO planted there would wait
    for a reader forever) and without following a link; it must be a regular file."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        raise RunFolderError(
            f"{path}: cannot open the run folder's lock ({exc.strerror or exc}); it must be a "
            f"regular file"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunFolderError(f"{path}: the run folder's lock is not a regular file")
    return os.fdopen(fd, "a")


def load_training_state(path: Path, map_location: Any) -> dict[str, Any]:
    """A trainer's `state.pt`, read as an input: a regular file within memory, loaded
    weights-only, holding a step >= 0, the decay branches done (steps >= 0), the model's and
    optimizer's state and the RNG state; anything else is one CheckpointError line."""
    import torch  # here, so the run folder's checks import without torch

    from smelt_interp.checkpoint import load_weights_only

    def damaged(why: str) -> CheckpointError:
        return CheckpointError(f"{path}: cannot resume, the training state is damaged ({why})")

    try:
        with open_input(path, memory_limit_bytes(), CheckpointError, "training state") as fh:
            state = load_weights_only(path, fh, map_location)
    except CheckpointError as exc:
        raise CheckpointError(f"cannot resume: {exc}") from None
    if not isinstance(state, dict):
        raise damaged(f"a {type(state).__name__}, not a dict")
    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise damaged(f"step {str(step)[:40]!r} is not a count of steps >= 0")
    branches = state.get("branches_done")
    if not isinstance(branches, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in branches
    ):
        raise damaged("branches_done is not a list of steps >= 0")
    for key in ("model", "optimizer"):
        if not isinstance(state.get(key), dict):
            raise damaged(f"no {key} state")
    rng = state.get("rng")  # the CPU generator's state, or {device kind: state}
    rngs = rng.values() if isinstance(rng, dict) else [rng]
    if not rngs or not all(torch.is_tensor(r) for r in rngs):
        raise damaged("no RNG state")
    return state


class RunLog:
    """Where a run appends its metrics, so that a run in a folder an earlier run used loses
    nothing of it until the new run is known good: a fresh run (not resumed) whose folder
    already holds `metrics.jsonl` logs to a pending file beside it, and only its first save
    (state or checkpoint, written after its weights were checked finite) renames that log over
    the earlier one. A run refused or diverged before then leaves the earlier run's log, state
    and checkpoint as they were, and does not call that checkpoint its own."""

    def __init__(self, folder: Path, name: str, resume: bool) -> None:
        self.final = folder / name
        self.pending = folder / f".{name}.pending.tmp"  # a stale one is removed as a temp file
        self.resume = resume
        self.saved = resume  # a resumed run's checkpoint is its own
        self._committed = resume or not self.final.exists()

    @property
    def path(self) -> Path:
        """The file to append the next record to."""
        return self.final if self._committed else self.pending

    def start(self) -> None:
        """A fresh run: begin a pending log (the earlier run's log is left as it is)."""
        if not self._committed:
            with contextlib.suppress(FileNotFoundError):
                self.pending.unlink()

    def set_aside(self) -> Path | None:
        """A resume that found no training state starts a fresh log: a log there (a run killed
        before its first save) is renamed to `NAME.before-resume-K` (the first free K), kept
        but no longer appended to, so no step is logged twice. Returns the new name."""
        self.saved = False  # nothing of this run is saved yet
        if not self.final.exists():
            return None
        k = 1
        while (aside := self.final.with_name(f"{self.final.name}.before-resume-{k}")).exists():
            k += 1
        os.replace(self.final, aside)
        return aside

    def commit(self) -> None:
        """The run saved its first state or checkpoint: its log replaces any earlier one."""
        self.saved = True
        if self._committed:
            return
        if self.pending.exists():
            os.replace(self.pending, self.final)
        else:
            with contextlib.suppress(FileNotFoundError):
                self.final.unlink()
        self._committed = True

    def kept(self, checkpoint: Path) -> str:
        """What a stopped run leaves: its last good checkpoint, or the earlier run's files."""
        if self.saved and checkpoint.exists():
            return f"the last good checkpoint {checkpoint} is kept"
        if checkpoint.exists() or self.final.exists():
            return f"nothing of this run was saved; the earlier run in {self.final.parent} is kept"
        return "nothing was saved"


def check_kept_folder(out_dir: Path, keep_until: int) -> None:
    """A run that keeps early checkpoints (`keep_until` > 0) copies them into
    `out_dir/KEPT_DIR`: something other than a folder there is refused before training, not at
    the first periodic checkpoint."""
    kept = out_dir / KEPT_DIR
    if keep_until > 0 and (kept.exists() or kept.is_symlink()) and not kept.is_dir():
        raise RunFolderError(
            f"{kept} is not a folder, and keep_ckpts_until={keep_until} keeps early "
            f"checkpoints there; move it away or set keep_ckpts_until=0"
        )
