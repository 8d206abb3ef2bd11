"""Run `python -m smelt_interp.train` under `torchrun` with gloo processes on this machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def torchrun_train(args: list[str], *, nproc: int = 2, timeout: int = 300) -> str:
    """Train with `nproc` local processes; their stdout, or a failure with each attempt's
    error lines.

    One retry: the processes meet over loopback TCP, and a sandboxed network can drop that
    rendezvous once (seen in CI: rank 0 exited during setup, not reproducible here). A real
    training bug is deterministic and fails both attempts."""
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which(
        "torchrun"
    )
    assert exe, "torchrun not found"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    command = [exe, "--standalone", "--nproc_per_node", str(nproc), "-m", "smelt_interp.train"]
    failures = []
    for _ in range(2):
        proc = subprocess.run(
            command + args, capture_output=True, text=True, timeout=timeout, env=env
        )
        if proc.returncode == 0:
            return proc.stdout
        errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
        failures.append("\n".join(errors[:12]) or proc.stderr[-1500:])
    raise AssertionError("torchrun failed twice:\n" + "\n---\n".join(failures))
