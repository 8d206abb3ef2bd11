"""How far a run folder's training has got, read while the trainer writes it.

`run_progress(run_dir)` is a cheap snapshot (state, step of steps, tokens, tokens/s, ETA) from
the folder's files: the tail of `metrics.jsonl`, the trainer's lock, the checkpoint's record
and, for runs a dashboard queued, the job record `job.json` (written by whoever launches the
trainer, see `write_job`). It never raises on a bad folder: a missing, replaced or foreign
folder is a state with a message.

`MetricsTail` follows one `metrics.jsonl` incrementally: each `read()` reads only the bytes
added since the last one, holds back a torn last line until its newline arrives, and starts
over when the file is replaced or shrinks (a resumed run rewrites its log atomically, a fresh
run deletes it). A first read starts at most FIRST_READ_BYTES from the end (a huge or sparse
log costs the same as a small one) and each read takes at most READ_BUDGET new bytes, the rest
coming on the next read; a reader never waits for another reader of the same tail (it returns
nothing new instead), so one slow disk holds up no other user's refresh.

Its history has a fixed size per event kind: every `stride`-th record of the series is kept
and the stride doubles when the cap is reached, so a 100k-line log costs at most `cap` records
a series while the curve still spans everything read (from step 0 for a log under
FIRST_READ_BYTES; a ring buffer would keep only the end). The newest record of each series is
kept exactly.

Every file is read only inside its run folder: a link whose target lies outside it is not
followed (`contained`, and O_NOFOLLOW on the open), so no file elsewhere reaches a browser."""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from smelt_interp.checkpoint import read_info
from smelt_interp.errors import CheckpointError, DataError, SmeltError
from smelt_interp.files import atomic_write_text, open_input, parse_json, read_input_bytes
from smelt_interp.provenance import CKPT_FILE, METRICS_FILE
from smelt_interp.train.run_folder import JOB_FILE, LOCK_FILE, LOG_FILE, STATE_FILE

RUN_FILES = (METRICS_FILE, CKPT_FILE, STATE_FILE, JOB_FILE, LOG_FILE)
STATES = ("queued", "training", "finished", "failed", "missing", "not_a_run")
JOB_MAX_BYTES = 1 << 20  # a job record is a few hundred bytes
TAIL_BYTES = 64 << 10  # how much of a log's end run_progress reads
READ_CHUNK = 1 << 20  # MetricsTail reads at most this much at once
DEFAULT_CAP = 2000  # records kept per series
MAX_LINE = 16 << 20  # a longer unfinished line is dropped as garbage
FIRST_READ_BYTES = 32 << 20  # a first read starts this far from the end (~200k records)
READ_BUDGET = 32 << 20  # the most one read() takes; the rest waits for the next read
MAX_ETA_S = 10 * 365 * 86400.0  # a longer estimate is shown as unknown
MAX_COUNT = 2**53  # a step, token count or rate past this is not a real run's: shown as unknown


@dataclass(frozen=True)
class RunProgress:
    run_dir: Path
    state: str  # "queued" | "training" | "finished" | "failed" | "missing" | "not_a_run"
    step: int | None  # last step logged
    steps: int | None  # planned steps (from the run's config)
    tokens_seen: int | None
    tokens_per_s: float | None
    eta_s: float | None
    message: str  # last log line when failed; why, when missing / not a run; "" otherwise


# ----- the job record ------------------------------------------------------------------------
def write_job(run_dir: Path, **fields: Any) -> None:
    """Write `<run_dir>/job.json`: `state` ("queued", "running", "failed", "stopped", "done"),
    `owner` (the pid that queued it), `pid` (the trainer's), `steps`, `returncode`, `command`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / JOB_FILE, json.dumps(fields, indent=1) + "\n")


def read_job(run_dir: Path) -> dict[str, Any]:
    """The job record, or {} when there is none or it cannot be read."""
    path = contained(run_dir, JOB_FILE)
    if path is None:
        return {}
    try:
        raw = read_input_bytes(path, JOB_MAX_BYTES, DataError, "job record", follow_links=False)
        data = parse_json(raw.decode("utf-8"), str(path), DataError)
    except (SmeltError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ----- small readers -------------------------------------------------------------------------
def _parse(line: str) -> dict[str, Any] | None:
    """One log line's record, or None when it is not a JSON object a trainer writes (invalid,
    nested past MAX_JSON_DEPTH, or so deep the parser recurses without bound)."""
    try:
        record = parse_json(line, "a log line", DataError)  # past MAX_JSON_DEPTH: refused
    except (SmeltError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    return record


def contained(run_dir: Path, name: str) -> Path | None:
    """`run_dir / name` when it resolves inside `run_dir` (a link pointing out of the run
    folder is never followed, so no file outside it reaches a browser); None otherwise."""
    path = run_dir / name
    try:
        real = os.path.realpath(path)
        root = os.path.realpath(run_dir)
    except (OSError, ValueError):
        return None
    if os.path.commonpath([root, real]) != root or real == root:
        return None
    return path


def _open_log(path: Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file inside its own folder (a FIFO, device
    or folder put where a log belongs would block a reader or never end; a link out of the run
    folder would show another file): a DataError otherwise."""
    if contained(path.parent, path.name) is None:
        raise DataError(f"{path}: a link out of its run folder; not read")
    return open_input(path, sys.maxsize, DataError, "log", follow_links=False)


def _tail_lines(path: Path, size: int = TAIL_BYTES) -> list[str]:
    """The complete lines in the last `size` bytes of `path` ([] when unreadable)."""
    try:
        with _open_log(path) as fh:
            end = fh.seek(0, os.SEEK_END)
            start = max(0, end - size)
            fh.seek(start)
            data = fh.read(end - start)
    except (OSError, SmeltError):
        return []
    if start > 0:
        data = data.partition(b"\n")[2]  # the first line is cut
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    return lines[:-1]  # the piece after the last newline is torn or empty


def last_log_line(path: Path) -> str:
    """The last non-blank line of a log (the last carriage-return segment of it), or ""."""
    for line in reversed(_tail_lines(path, 8 << 10) + [_torn_end(path)]):
        shown = line.rsplit("\r", 1)[-1].strip() if line.strip() else ""
        if shown:
            return shown[:500]
    return ""


def _torn_end(path: Path) -> str:
    try:
        with _open_log(path) as fh:
            end = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, end - 2048))
            return fh.read().decode("utf-8", errors="replace").rsplit("\n", 1)[-1]
    except (OSError, SmeltError):
        return ""


def _number(value: Any) -> float | None:
    """A finite number of at most MAX_COUNT in magnitude, else None: an infinite, NaN or
    absurd value in a log is unknown, not a 300-digit step."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range
        return None
    return number if math.isfinite(number) and abs(number) <= MAX_COUNT else None


def _count(value: Any) -> int | None:
    """A step or token count: a whole number 0..MAX_COUNT, else None."""
    number = _number(value)
    return int(number) if number is not None and number >= 0 else None


_INFO_CACHE: dict[Path, tuple[tuple[int, int, int], Any]] = {}
_INFO_LOCK = threading.Lock()


def _checkpoint_info(path: Path):
    """read_info of a checkpoint, cached by (inode, mtime, size); None when absent or bad."""
    if contained(path.parent, path.name) is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    key = (st.st_ino, st.st_mtime_ns, st.st_size)
    with _INFO_LOCK:
        hit = _INFO_CACHE.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]
    try:
        info = read_info(path)
    except (CheckpointError, OSError):
        info = None
    with _INFO_LOCK:
        _INFO_CACHE[path] = (key, info)
    return info


def lock_held(run_dir: Path) -> bool:
    """True when a process holds the trainer's flock on `<run_dir>/.lock`. Read from
    /proc/locks, never by trying the lock (a probe could refuse a trainer starting that
    instant); where /proc/locks is missing, a log written in the last two minutes counts."""
    try:
        inode = (run_dir / LOCK_FILE).stat().st_ino
    except OSError:
        return False
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        try:
            import time

            return time.time() - (run_dir / METRICS_FILE).stat().st_mtime < 120
        except OSError:
            return False
    for line in table.splitlines():
        parts = line.split()
        if "FLOCK" in parts and len(parts) >= 6 and parts[5].rsplit(":", 1)[-1] == str(inode):
            return True
    return False


# ----- the snapshot --------------------------------------------------------------------------
def _last_train(path: Path) -> tuple[dict[str, Any] | None, float | None]:
    """The last train record in the log's tail, and the median tokens/s of the last 20."""
    records = [r for r in map(_parse, _tail_lines(path)) if r and r.get("event") == "train"]
    if not records:
        return None, None
    speeds = [s for r in records[-20:] if (s := _number(r.get("tokens_per_s"))) and s > 0]
    return records[-1], (statistics.median(speeds) if speeds else None)


def _planned_steps(job: dict[str, Any], info: Any) -> int | None:
    steps = job.get("steps")
    if isinstance(steps, int) and not isinstance(steps, bool) and 0 < steps <= MAX_COUNT:
        return steps
    cfg = getattr(info, "train_config", None) or {}
    steps = cfg.get("steps") if isinstance(cfg, dict) else None
    ok = isinstance(steps, int) and not isinstance(steps, bool) and 0 < steps <= MAX_COUNT
    return steps if ok else None


def run_progress(run_dir: str | os.PathLike[str]) -> RunProgress:
    """Where the run in `run_dir` stands; never raises on a bad folder."""
    run_dir = Path(run_dir)
    try:
        return _run_progress(run_dir)
    except Exception as exc:  # noqa: BLE001 - a folder changing under us is a state, not a crash
        return RunProgress(run_dir, "failed", None, None, None, None, None, f"unreadable: {exc}")


def _run_progress(run_dir: Path) -> RunProgress:
    def out(state: str, message: str = "", **kw: Any) -> RunProgress:
        fields = dict(step=None, steps=None, tokens_seen=None, tokens_per_s=None, eta_s=None)
        return RunProgress(run_dir, state, message=message, **{**fields, **kw})

    if not run_dir.exists():
        return out("missing", f"{run_dir}: no such folder (deleted or renamed?)")
    if not run_dir.is_dir():
        return out("not_a_run", f"{run_dir}: a file, not a run folder")
    if not any((run_dir / name).exists() for name in (*RUN_FILES, LOCK_FILE)):
        return out(
            "not_a_run", f"{run_dir}: not a run folder (no {METRICS_FILE}, {CKPT_FILE} or log)"
        )
    job = read_job(run_dir)
    info = _checkpoint_info(run_dir / CKPT_FILE)
    last, speed = _last_train(run_dir / METRICS_FILE)
    steps = _planned_steps(job, info)
    step = _count(last.get("step")) if last else None
    tokens = _count(last.get("tokens")) if last else None
    if step is None and info is not None and info.step is not None:
        step = info.step
    eta = None
    if steps and step is not None and tokens and speed and step > 0:
        eta = max(0, steps - step) * (tokens / step) / speed
        eta = eta if eta <= MAX_ETA_S else None  # a rate near zero: no useful estimate
    numbers = dict(step=step, steps=steps, tokens_seen=tokens, tokens_per_s=speed, eta_s=eta)
    training = lock_held(run_dir) or (job.get("state") == "running" and _alive(job.get("pid")))
    if training:
        return out("training", **numbers)
    if info is not None and info.final:
        return out("finished", **{**numbers, "eta_s": None})
    if job.get("state") in ("queued", "running") and _alive(job.get("owner")):
        return out("queued", **numbers)
    line = last_log_line(run_dir / LOG_FILE)
    if job.get("state") == "failed" or line.startswith(("error:", "Traceback")):
        return out("failed", line or f"the trainer exited with {job.get('returncode')}", **numbers)
    if step is None and job.get("state") in ("queued", "stopped"):
        # queued by a server that has stopped since, before the job's turn came
        return out("queued", "not started; the next `make demo` trains it", **numbers)
    where = f"at step {step} of {steps or '?'}" if step is not None else "before its first step"
    return out(
        "failed",
        f"stopped {where}, no trainer is running it"
        + (f" (its log ends: {line})" if line else "")
        + "; train it again with --resume to continue",
        **{**numbers, "eta_s": None},
    )


# ----- incremental reading -------------------------------------------------------------------
class Series:
    """One event kind's records, downsampled to at most `cap` (every `stride`-th record by its
    index in the series), plus the newest record exactly."""

    def __init__(self, cap: int = DEFAULT_CAP) -> None:
        if cap < 2:
            raise ValueError("cap must be at least 2")
        self.cap = cap
        self.stride = 1
        self.count = 0  # records seen
        self.kept: list[tuple[int, dict[str, Any]]] = []
        self.last: dict[str, Any] | None = None

    def add(self, record: dict[str, Any]) -> None:
        index, self.count = self.count, self.count + 1
        self.last = record
        if index % self.stride:
            return
        self.kept.append((index, record))
        if len(self.kept) > self.cap:
            self.stride *= 2
            self.kept = [(i, r) for i, r in self.kept if i % self.stride == 0]

    def records(self) -> list[dict[str, Any]]:
        """The kept records in order, ending with the newest one."""
        out = [r for _, r in self.kept]
        if self.last is not None and (not out or out[-1] is not self.last):
            out.append(self.last)
        return out


class MetricsTail:
    """Follows one metrics.jsonl: `read()` parses only what was appended since the last call.

    `generation` counts restarts (the file replaced or shrunk, or gone and back), so a view
    drawn from an older generation knows to redraw from scratch. `bad_lines` counts complete
    lines that were not JSON objects (skipped); `missing` is True while the file is absent;
    `skipped` is how many bytes at the log's start a first read passed over.

    Two locks: `lock` lets one thread read the file at a time and is only ever tried, never
    waited for; the history's own lock is held just to add parsed records or copy them out, so
    a read in progress (a slow disk, a long log) holds up no other thread."""

    def __init__(self, path: str | os.PathLike[str], cap: int = DEFAULT_CAP) -> None:
        self.path = Path(path)
        self.cap = cap
        self.generation = 0
        self.lock = threading.Lock()  # the reader's: tried, never waited for
        self._data = threading.Lock()  # the history's: held only briefly
        self._reset()
        self.generation = 0

    def _reset(self) -> None:
        with self._data:
            self.offset = 0
            self.identity: tuple[int, int] | None = None
            self.pending = b""  # a torn last line, held until its newline arrives
            self.lines = 0  # complete lines read
            self.bad_lines = 0
            self.series: dict[str, Series] = {}
            self.missing = False
            self.skipped = 0
            self.cut = False  # the next complete line is the end of one a first read cut
            self.generation += 1

    def read(self) -> list[dict[str, Any]]:
        """The records appended since the last read (all of them, also those the history drops
        by downsampling), in file order; [] while another thread is reading this tail (that
        read brings the history up to date; this caller shows what is there)."""
        if not self.lock.acquire(blocking=False):
            return []
        try:
            return self._read()
        finally:
            self.lock.release()

    def _read(self) -> list[dict[str, Any]]:
        try:
            fh = _open_log(self.path)
        except SmeltError:
            if not self.missing:
                self._reset()
                self.missing = True
            return []
        with fh:
            st = os.fstat(fh.fileno())
            identity = (st.st_dev, st.st_ino)
            if self.missing or (self.identity not in (None, identity)) or st.st_size < self.offset:
                self._reset()
            if self.identity is None and st.st_size > FIRST_READ_BYTES:
                # A first look at a long log reads its end only: its cost does not grow with
                # the log (a sparse 40 GB file is read as fast as an 8 MiB one).
                self.offset = self.skipped = st.st_size - FIRST_READ_BYTES
                fh.seek(self.offset - 1)
                self.cut = fh.read(1) != b"\n"  # the start fell inside a line
            self.identity = identity
            fh.seek(self.offset)
            new: list[dict[str, Any]] = []
            budget = READ_BUDGET  # the rest of a long append comes on the next read
            while budget > 0:
                chunk = fh.read(min(READ_CHUNK, budget))
                if not chunk:
                    break
                budget -= len(chunk)
                self.offset += len(chunk)
                data = self.pending + chunk
                complete, _, self.pending = data.rpartition(b"\n")
                if complete or data.endswith(b"\n"):
                    lines = complete.split(b"\n")
                    if self.cut:
                        self.cut, lines = False, lines[1:]
                    new.extend(self._take(lines))
                if len(self.pending) > MAX_LINE:  # no record is this long: not a log
                    self.pending = b""
                    self.cut = False
                    self.bad_lines += 1
            return new

    def _take(self, raw_lines: Iterable[bytes]) -> list[dict[str, Any]]:
        parsed: list[dict[str, Any] | None] = []
        for raw in raw_lines:
            if raw.strip():
                parsed.append(_parse(raw.decode("utf-8", errors="replace")))
        out = [r for r in parsed if r is not None]
        with self._data:
            self.lines += len(parsed)
            self.bad_lines += len(parsed) - len(out)
            for record in out:
                kind = str(record.get("event", ""))
                self.series.setdefault(kind, Series(self.cap)).add(record)
        return out

    def records(self, event: str) -> list[dict[str, Any]]:
        """The kept history of one event kind ("train", "eval"), oldest first."""
        with self._data:
            series = self.series.get(event)
            return series.records() if series else []

    def count(self, event: str) -> int:
        """How many records of one event kind were read (kept or not)."""
        with self._data:
            series = self.series.get(event)
            return series.count if series else 0

    def last(self, event: str) -> dict[str, Any] | None:
        with self._data:
            series = self.series.get(event)
            return series.last if series else None

    @property
    def torn(self) -> bool:
        """True while the file ends in a line without its newline (the trainer mid-write)."""
        return bool(self.pending)
