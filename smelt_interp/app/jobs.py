"""Training in the background while the dashboard serves: the demo pairs' missing models
(DEMO_PAIRS, in their order), one job at a time, each the ordinary
`python -m smelt_interp.train ... --resume` process with its output in `<run folder>/train.log`.

Each job's state is written to `<run folder>/job.json` (queued, running, done, failed, stopped),
which the Runs page reads through `train.progress.run_progress`. Each trainer runs under a
keeper (smelt_interp.app.keeper) in a session of its own: `stop()` ends the trainer's whole
process group the way Ctrl-C would (SIGINT: it stops between writes, and the folder lock is
released with the process), escalating to SIGTERM and SIGKILL if it does not exit, and waits
for it, so no trainer outlives the server, not even a wrapper script's worker; and the keeper
stops the group itself when the server dies without calling stop() (SIGKILL, a crash).
The trainer's own checkpointing and `--resume` mean the next
start continues where this one stopped; its folder lock keeps a second trainer off a folder.

The trainer command is `<this python> -m smelt_interp.train` unless the environment variable
SMELT_TRAINER names another (a shell-quoted command line; the job's arguments follow it). The
real pretrained model is prepared beside the training by a runner of its own (real_lm_job:
`python -m smelt_interp.commands.real_lm`, or SMELT_REAL_LM's command), so its minute of work
waits for no trainer."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from smelt_interp.errors import ConfigError
from smelt_interp.train.progress import LOG_FILE, read_job, write_job

TRAINER_ENV = "SMELT_TRAINER"
REAL_LM_ENV = "SMELT_REAL_LM"  # replaces the real model's preparation command (tests)
# The pairs `make demo` serves and trains, in training order: (preset, run folder, the suffix of
# its models' names). The recall pair trains in minutes and shows a sink early; then the
# default Dyck pair.
DEMO_PAIRS: tuple[tuple[str, Path, str], ...] = (
    ("recall-pair", Path("runs") / "recall-pair", "-recall"),
    ("dyck-pair", Path("runs") / "dyck-pair", ""),
)
# `make demo` also prepares the real pretrained model (commands.real_lm) beside the training, in
# a job of its own whose record and log live here, and serves it once its folder is complete.
REAL_LM_RUN = Path("runs") / "real-lm"
STOP_GRACE_S = 20.0  # after SIGINT, how long a trainer may take to stop before SIGTERM


@dataclass(frozen=True)
class TrainJob:
    """One trainer run: the folder it writes, its command-line arguments, its planned steps."""

    run_dir: Path
    args: tuple[str, ...]
    steps: int | None = None


def trainer_command() -> list[str]:
    """The command that trains (SMELT_TRAINER, or this Python's `-m smelt_interp.train`); a
    SMELT_TRAINER that is no command line (an unbalanced quote, no program) is a ConfigError."""
    return command_from_env(TRAINER_ENV, [sys.executable, "-m", "smelt_interp.train"])


def command_from_env(variable: str, default: list[str]) -> list[str]:
    """The shell-quoted command line in the environment `variable`, else `default`; one that is
    no command line (an unbalanced quote, no program) is a ConfigError."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    try:
        command = shlex.split(raw)
    except ValueError as exc:  # shlex: "No closing quotation", "No escaped character"
        raise ConfigError(f"{variable}={raw[:200]!r} is not a command line: {exc}") from None
    if not command or not command[0]:
        raise ConfigError(f"{variable}={raw[:200]!r} names no program")
    return command


KEEPER = (sys.executable, "-m", "smelt_interp.app.keeper")


def pair_jobs(root: Path, preset: str, archs: Sequence[str]) -> list[TrainJob]:
    """One job per architecture in `archs` of the preset's pair, trained into `root/<arch>`."""
    from smelt_interp.train.config import TrainConfig
    from smelt_interp.train.presets import get_preset
    from smelt_interp.train.trainer import pair_configs

    configs = pair_configs(TrainConfig.from_dict(get_preset(preset)))
    return [
        TrainJob(
            root / arch,
            ("--preset", preset, "--arch", arch, "--out", str(root), "--resume", "--quiet"),
            configs[arch].schedule.steps,
        )
        for arch in archs
    ]


def real_lm_job(folder: Path) -> TrainJob:
    """The preparation of the real model into `folder` (real_lm_command()'s `--out FOLDER`),
    its log and record in REAL_LM_RUN."""
    return TrainJob(REAL_LM_RUN, ("--out", str(folder)))


def real_lm_command() -> list[str]:
    """The command that prepares the real model: `<this python> -m
    smelt_interp.commands.real_lm`, unless REAL_LM_ENV names another (tests: a stub)."""
    return command_from_env(REAL_LM_ENV, [sys.executable, "-m", "smelt_interp.commands.real_lm"])


class JobRunner:
    """Runs `jobs` in order on a background thread, one trainer process at a time."""

    def __init__(self, jobs: Sequence[TrainJob], command: Sequence[str] | None = None) -> None:
        self.jobs = list(jobs)
        if command is None:  # SMELT_TRAINER is read (and refused) only when something trains
            command = trainer_command() if self.jobs else []
        self.command = list(command)
        self._lock = threading.Lock()
        self._stopping = False
        self._proc: subprocess.Popen | None = None
        self._queued = False
        self._thread = threading.Thread(target=self._loop, name="train-jobs", daemon=True)

    def queue(self) -> JobRunner:
        """Record every job as queued (each folder made), before any starts."""
        for job in self.jobs:
            self._record(job, "queued")
        self._queued = True
        return self

    def start(self) -> JobRunner:
        """Start running the jobs in order on the background thread."""
        if not self._queued:
            self.queue()
        self._thread.start()
        return self

    @property
    def current(self) -> subprocess.Popen | None:
        """The trainer process running now, if any."""
        return self._proc

    def _record(self, job: TrainJob, state: str, **extra) -> None:
        try:
            write_job(
                job.run_dir,
                state=state,
                owner=os.getpid(),
                steps=job.steps,
                command=[*self.command, *job.args],
                **extra,
            )
        except OSError:
            pass  # the folder went away: the Runs page says so

    def _loop(self) -> None:
        for job in self.jobs:
            with self._lock:
                if self._stopping:
                    return
                try:
                    job.run_dir.mkdir(parents=True, exist_ok=True)
                    with open(job.run_dir / LOG_FILE, "ab") as log:  # the child keeps its copy
                        started = time.strftime("%Y-%m-%d %H:%M:%S")
                        line = f"--- {started}: {shlex.join([*self.command, *job.args])}\n"
                        log.write(line.encode())
                        log.flush()
                        proc = subprocess.Popen(
                            [*KEEPER, *self.command, *job.args],
                            # the keeper's lifeline: its end-of-file says this process is gone
                            stdin=subprocess.PIPE,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            # a group of its own: stop() ends it all, the terminal's Ctrl-C not
                            start_new_session=True,
                        )
                except OSError as exc:
                    self._record(job, "failed", returncode=None, error=str(exc))
                    continue
                self._proc = proc
                self._record(job, "running", pid=proc.pid)
            code = proc.wait()
            _signal_group(proc.pid, signal.SIGKILL)  # whatever a wrapper left behind
            if proc.stdin is not None:
                proc.stdin.close()
            with self._lock:
                self._proc = None
                state = "stopped" if self._stopping else "done" if code == 0 else "failed"
                self._record(job, state, pid=proc.pid, returncode=code)

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Stop the running trainer (SIGINT, then SIGTERM, then SIGKILL), wait for it, and mark
        the jobs not run as stopped. Safe to call twice."""
        with self._lock:
            already, self._stopping = self._stopping, True
            proc = self._proc
        if proc is not None and proc.poll() is None:
            # The trainer's whole group (it leads a session of its own): a wrapper script and
            # the worker it started get the signal alike.
            for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                _signal_group(proc.pid, sig)
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if proc is not None:
            _signal_group(proc.pid, signal.SIGKILL)  # what outlived the keeper
        if self._thread.is_alive():
            self._thread.join(10.0)
        if not self._queued:
            return
        if not already:
            for job in self.jobs:
                if read_job(job.run_dir).get("state") == "queued":
                    self._record(job, "stopped")


def _signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to process group `pgid` (a keeper's: its pid); nothing when the group is gone.
    The id of a group that still has members is never given to a new process, so this cannot
    reach a stranger."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
