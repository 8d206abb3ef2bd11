"""The run folders the Runs page watches, and one MetricsTail for each.

The folders are the ones the app was given (each served checkpoint's folder, trained or not yet)
and those found under its root (default runs/, searched a few levels deep for folders holding a
metrics log, checkpoint or job record; decay branches belong to their run). Nothing outside
them is opened. A folder once listed stays listed, so one deleted or renamed while watched is
shown as missing rather than vanishing. At most MAX_RUNS are watched, each tail keeping at most
`cap` records a series, so memory is bounded however long the server polls."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from smelt_interp.measure.provenance import CKPT_FILE, METRICS_FILE
from smelt_interp.train.progress import JOB_FILE, MetricsTail, RunProgress, run_progress

MAX_RUNS = 32
SCAN_DEPTH = 3  # runs/<pair>/<arch> is two levels down; a ladder's runs three
CAP = 1000  # records kept per series and run: a point per pixel of a wide figure
MARKERS = (METRICS_FILE, CKPT_FILE, JOB_FILE)


@dataclass(frozen=True)
class RunView:
    """One watched run as the page draws it: its name, progress and tail."""

    name: str
    progress: RunProgress
    tail: MetricsTail


def find_runs(root: Path, depth: int = SCAN_DEPTH) -> list[Path]:
    """Run folders at or under `root` (folders holding a metrics log, checkpoint or job record,
    not decay branches, not hidden), at most `depth` levels down, in name order."""
    found: list[Path] = []

    def walk(folder: Path, level: int) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return
        names = {e.name for e in entries}
        if any(m in names for m in MARKERS):
            found.append(folder)
        if level >= depth:
            return
        for entry in entries:
            if entry.name.startswith((".", "branch-")) or not entry.is_dir(follow_symlinks=False):
                continue
            walk(Path(entry.path), level + 1)

    if root.is_dir():
        walk(root, 0)
    return found


class RunsWatcher:
    """The watched folders (given, plus found under `root` at each poll) and their tails."""

    def __init__(self, max_runs: int = MAX_RUNS, cap: int = CAP) -> None:
        self.max_runs = max_runs
        self.cap = cap
        self.root: Path | None = None
        self._dirs: dict[Path, None] = {}  # watched folders, in first-seen order
        self._tails: dict[Path, MetricsTail] = {}
        self._lock = threading.Lock()

    def watch(self, run_dirs: Iterable[Path], root: Path | None = None) -> None:
        """Watch `run_dirs` (from now on) and what is found under `root` (replacing any
        earlier setting)."""
        with self._lock:
            self.root = root
            self._dirs = {}
            self._tails = {}
            self._add(Path(d) for d in run_dirs)

    def _add(self, dirs: Iterable[Path]) -> None:
        known = {d.resolve() for d in self._dirs}
        for d in dirs:
            if len(self._dirs) >= self.max_runs:
                return
            if d.resolve() not in known:
                known.add(d.resolve())
                self._dirs[d] = None

    def run_dirs(self) -> list[Path]:
        with self._lock:
            if self.root is not None:
                self._add(find_runs(self.root))
            return list(self._dirs)

    def name(self, run_dir: Path) -> str:
        """A run's short name: its path under the root, else its last two folder names."""
        if self.root is not None:
            try:
                rel = run_dir.resolve().relative_to(self.root.resolve())
                if rel.parts:
                    return rel.as_posix()
            except (ValueError, OSError):
                pass
        return "/".join(run_dir.parts[-2:]) if len(run_dir.parts) > 1 else str(run_dir)

    def tail(self, run_dir: Path) -> MetricsTail:
        with self._lock:
            tail = self._tails.get(run_dir)
            if tail is None:
                tail = self._tails[run_dir] = MetricsTail(run_dir / METRICS_FILE, cap=self.cap)
            return tail

    def poll(self) -> list[RunView]:
        """Every watched run's progress, its tail brought up to date (new bytes only)."""
        views = []
        for run_dir in self.run_dirs():
            tail = self.tail(run_dir)
            tail.read()
            views.append(RunView(self.name(run_dir), run_progress(run_dir), tail))
        return views
