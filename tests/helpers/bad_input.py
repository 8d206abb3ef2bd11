"""Helpers shared by the bad-input tests: run a command in this process exactly
as `python -m` runs it, and check that it failed with one `error: ...` line and exit code 2."""

from __future__ import annotations

import hashlib
import io
import runpy
import sys
import warnings
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any


def run_command(module: str, *args: Any) -> tuple[int, str, str]:
    """Run `python -m module args...` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = [module, *map(str, args)]
    try:
        with redirect_stdout(out), redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: module already imported
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=False)
                code = 0
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:  # sys.exit("message"): Python prints it and exits 1
                    print(exc.code, file=sys.stderr)
                    code = 1
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    """Exit code 2, exactly one non-blank stderr line saying `error:`, no traceback, and each
    needle in that line (case-insensitive)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, f"exit {code}, stderr:\n{err}"
    assert len(lines) == 1, f"expected one line, got:\n{err}"
    assert "Traceback" not in err
    assert "error: " in lines[0], lines[0]  # `error: ...`, or argparse's `prog: error: ...`
    for needle in needles:
        assert str(needle).lower() in lines[0].lower(), lines[0]


def digest(path: Path) -> str:
    """SHA-256 of a file's bytes: to check that a failed command left it as it was."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_bounded(
    module: str, *args: Any, timeout: float = 120, memory: int = 4 << 30
) -> tuple[int, str, str]:
    """`python -m module args...` in a child process that a hang (a FIFO read) or unbounded
    reading (/dev/zero) cannot take down the test run with: killed after `timeout` seconds (a
    TimeoutExpired fails the test), its address space capped at `memory` bytes."""
    import os
    import resource
    import subprocess

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    proc = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return proc.returncode, proc.stdout, proc.stderr
