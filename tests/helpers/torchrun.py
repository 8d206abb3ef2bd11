"""Run `python -m smelt_interp.train` (or a script) under `torchrun` with gloo processes on this
machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def torchrun_command(target: list[str], *, nproc: int = 2) -> list[str]:
    """argv of `torchrun --standalone` with `nproc` local processes running `target` (a script
    and its arguments, or `-m module ...`)."""
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which(
        "torchrun"
    )
    assert exe, "torchrun not found"
    return [exe, "--standalone", "--nproc_per_node", str(nproc), *target]


def torchrun_env() -> dict[str, str]:
    """One thread per process, loopback for gloo, and this checkout first on the import path."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": path}


def torchrun_attempts(command: list[str], *, cwd: Path | None = None, timeout: float = 300) -> str:
    """Run a whole torchrun `command`; its stdout, or a failure with each attempt's error lines.

    One retry: the processes meet over loopback TCP, and a sandboxed network can drop that
    rendezvous once (seen in CI: rank 0 exited during setup, not reproducible here). A real
    training bug is deterministic and fails both attempts."""
    failures = []
    for _ in range(2):
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=torchrun_env(), cwd=cwd
        )
        if proc.returncode == 0:
            return proc.stdout
        errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
        failures.append("\n".join(errors[:12]) or proc.stderr[-1500:])
    raise AssertionError("torchrun failed twice:\n" + "\n---\n".join(failures))


def torchrun_run(target: list[str], *, nproc: int = 2, timeout: int = 300) -> str:
    """Run `target` under torchrun with `nproc` local processes (see torchrun_attempts)."""
    return torchrun_attempts(torchrun_command(target, nproc=nproc), timeout=timeout)


def torchrun_train(args: list[str], *, nproc: int = 2, timeout: int = 300) -> str:
    """Train with `nproc` local processes (`python -m smelt_interp.train ARGS`); their stdout."""
    return torchrun_run(["-m", "smelt_interp.train", *args], nproc=nproc, timeout=timeout)
