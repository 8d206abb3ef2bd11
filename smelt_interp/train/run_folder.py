"""A training run's folder: refuse a path that cannot be a folder, hold an exclusive lock for
the run (`fcntl.flock` on `<folder>/.lock`; the kernel releases it when the process ends, so a
killed run never leaves the folder stuck), and remove the temp files that an atomic write killed
mid-save left behind."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from pathlib import Path
from types import TracebackType
from typing import IO

from smelt_interp.errors import RunFolderError

# The files of a run folder, named here alone: every part that reads or writes one imports it.
LOCK_FILE = ".lock"
CKPT_FILE = "ckpt.pt"  # the model (the latest checkpoint)
METRICS_FILE = "metrics.jsonl"  # the training log, one JSON record a line
STATE_FILE = "state.pt"  # optimizer, data and RNG state for --resume
JOB_FILE = "job.json"  # a queued or launched background job's record
LOG_FILE = "train.log"  # the trainer's output when a background job launched it


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
    """Delete the temp files (`.<name>.<random>.tmp`, see smelt_interp.atomic) of `names` in
    `folder` and its subfolders one level down (decay branches); the removed paths."""
    pattern = re.compile(
        r"^\.(?:" + "|".join(re.escape(n) for n in names) + r")\.[A-Za-z0-9_]+\.tmp$"
    )
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
            fh = open(self.path / LOCK_FILE, "a")  # held until __exit__
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
            self._fh.close()  # closing the file releases the lock
            self._fh = None
