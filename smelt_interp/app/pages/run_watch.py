"""The run folders the Runs page watches, and one MetricsTail for each.

The folders are the ones the app was given (each served checkpoint's folder, trained or not yet)
and those found under its root (default runs/, searched a few levels deep for folders holding a
metrics log, checkpoint or job record; decay branches belong to their run). Nothing outside
them is opened. A folder once listed stays listed, so one deleted or renamed while watched is
shown as missing rather than vanishing. At most MAX_RUNS are watched, each tail keeping at most
`cap` records a series, so memory is bounded however long the server polls.

The root is searched at most every RESCAN_S seconds (the first poll searches at once), never
again once MAX_RUNS are watched, and a search looks into at most SCAN_FOLDERS folders: a root
of 80,000 empty folders costs a refresh nothing. One thread searches at a time, outside the
lock the refreshes share; the others use the folders already found."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from smelt_interp.provenance import CKPT_FILE, METRICS_FILE
from smelt_interp.train.progress import JOB_FILE, MetricsTail, RunProgress, run_progress

MAX_RUNS = 32
SCAN_DEPTH = 3  # runs/<pair>/<arch> is two levels down; a ladder's runs three
CAP = 1000  # records kept per series and run: a point per pixel of a wide figure
MARKERS = (METRICS_FILE, CKPT_FILE, JOB_FILE)
RESCAN_S = 30.0  # how often the root is searched for new run folders
SCAN_FOLDERS = 2000  # the most folders one search looks into


@dataclass(frozen=True)
class RunView:
    """One watched run as the page draws it: its name, progress and tail."""

    name: str
    progress: RunProgress
    tail: MetricsTail


def find_runs(
    root: Path, depth: int = SCAN_DEPTH, max_folders: int | None = None, limit: int = MAX_RUNS
) -> list[Path]:
    """Run folders at or under `root` (folders holding a metrics log, checkpoint or job record,
    not decay branches, not hidden), at most `depth` levels down, in name order; the search
    stops after looking into `max_folders` folders or finding `limit` runs."""
    found: list[Path] = []
    looked = 0
    max_folders = SCAN_FOLDERS if max_folders is None else max_folders

    def walk(folder: Path, level: int) -> None:
        nonlocal looked
        if looked >= max_folders or len(found) >= limit:
            return
        looked += 1
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
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
        self._scanning = threading.Lock()  # one search of the root at a time; tried, not waited
        self._scanned_at: float | None = None  # time.monotonic() of the last search

    def watch(self, run_dirs: Iterable[Path], root: Path | None = None) -> None:
        """Watch `run_dirs` (from now on) and what is found under `root` (replacing any
        earlier setting)."""
        with self._lock:
            self.root = root
            self._dirs = {}
            self._tails = {}
            self._scanned_at = None
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
        """The watched folders, the root searched first when a search is due."""
        self._maybe_scan()
        with self._lock:
            return list(self._dirs)

    def _maybe_scan(self) -> None:
        with self._lock:
            root, full = self.root, len(self._dirs) >= self.max_runs
            last = self._scanned_at
        due = last is None or time.monotonic() - last >= RESCAN_S
        if root is None or full or not due or not self._scanning.acquire(blocking=False):
            return
        try:
            found = find_runs(root, limit=self.max_runs)
            with self._lock:
                if self.root == root:
                    self._add(found)
                    self._scanned_at = time.monotonic()
        finally:
            self._scanning.release()

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
