"""Device scripts as parts: each part one command in its own process group under a deadline, its
record (status, seconds, the JSON it wrote, its last lines of output) kept whatever happens to
the others, and the whole report rewritten atomically after each part, so a call stopped midway
keeps what finished. The GPU check (gpu.check) and the language-model pair (gpu.lm_pair) run
their parts through here."""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smelt_interp.files import atomic_write_text, json_text

ROOT = Path(__file__).resolve().parent.parent
OUT_TOKEN = "{out}"  # replaced in a part's argv by the path its JSON result goes to
LOG_LINES = 40  # lines of a part's output its record keeps

Record = dict[str, Any]


@dataclass
class Part:
    """One step of a device script: a command run in its own process under `deadline_s`."""

    name: str
    deadline_s: float
    argv: list[str]
    what: str
    env: dict[str, str] = field(default_factory=dict)


def _tail_reader(stream, name: str, lines: collections.deque, echo: bool) -> None:
    for line in stream:
        line = line.rstrip("\n")
        lines.append(line)
        if echo:
            print(f"  [{name}] {line}", flush=True)


def run_part(part: Part, result_path: Path, echo: bool = True) -> Record:
    """Run `part` in a new process group; kill the group at its deadline. The record:
    status ok | failed | timeout, seconds, returncode, the JSON the part wrote (if any),
    and the last lines of its output."""
    result_path.unlink(missing_ok=True)
    argv = [str(result_path) if a == OUT_TOKEN else a for a in part.argv]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **part.env}
    lines: collections.deque[str] = collections.deque(maxlen=LOG_LINES)
    start = time.monotonic()
    status, returncode = "failed", None
    try:
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, so the deadline kills it all
        )
    except OSError as exc:
        lines.append(f"could not start: {exc}")
    else:
        reader = threading.Thread(target=_tail_reader, args=(proc.stdout, part.name, lines, echo))
        reader.start()
        try:
            returncode = proc.wait(timeout=part.deadline_s)
            status = "ok" if returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait()
            status = "timeout"
            lines.append(f"killed at its deadline of {part.deadline_s:.0f} s")
        reader.join(timeout=5)
    result = None
    if result_path.exists():
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError):
            result = None
    return {
        "name": part.name,
        "status": status,
        "deadline_s": part.deadline_s,
        "seconds": round(time.monotonic() - start, 2),
        "returncode": returncode,
        "result": result,
        "log_tail": list(lines),
    }


def run_parts(
    parts: Sequence[Part],
    out: Path | None,
    header: dict[str, Any],
    echo: bool = True,
    *,
    runner: Callable[[Part, Path, bool], Record] = run_part,
    tag: str = "smelt-part",
) -> dict[str, Any]:
    """Run every part in order, whatever happens to the others; write `out` after each.
    `runner` runs one part (run_part, or a script's own that reads more into its record)."""
    report: dict[str, Any] = {**header, "parts": {}}
    scratch = Path(os.environ.get("TMPDIR", "/tmp"))
    for part in parts:
        print(f"== {part.name} (deadline {part.deadline_s:.0f} s): {part.what}", flush=True)
        path = scratch / f"{tag}-{os.getpid()}-{part.name}.json"
        record = runner(part, path, echo)
        path.unlink(missing_ok=True)
        report["parts"][part.name] = record
        print(f"== {part.name}: {record['status']} in {record['seconds']:.0f} s", flush=True)
        if out is not None:
            atomic_write_text(out, json_text(report) + "\n")
    return report


def plan_lines(script: str, parts: Sequence[Part], out: Path | None) -> list[str]:
    """What a `--dry-run` prints: each part's deadline, what it does and the command it runs."""
    total = sum(p.deadline_s for p in parts)
    lines = [f"{script} plan: {len(parts)} part(s), at most {total:.0f} s ({total / 60:.1f} min)"]
    width = max((len(p.name) for p in parts), default=0)
    for p in parts:
        lines.append(f"  {p.name:{width}s} deadline {p.deadline_s:4.0f} s  {p.what}")
        env = "".join(f"{k}={v} " for k, v in p.env.items())
        lines.append(f"{' ' * (width + 3)}runs: {env}{' '.join(p.argv)}")
    lines.append(f"  results JSON: {out if out is not None else '(none; give --out PATH)'}")
    return lines


class OneLineParser(argparse.ArgumentParser):
    """A device script's parser: a bad flag is one line naming the script, exit 2, no usage."""

    def __init__(self, script: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.script = script

    def error(self, message: str) -> None:
        print(f"{self.script}: {message}", file=sys.stderr)
        raise SystemExit(2)


def parts_parser(script: str, prog: str, parts: str, **kwargs: Any) -> OneLineParser:
    """The flags every device script takes: --dry-run, --only PARTS (`parts` names them),
    --out JSON, and the hidden --part/--part-out with which the script runs one part in a
    child process of its own."""
    p = OneLineParser(script, prog=prog, **kwargs)
    p.add_argument("--dry-run", action="store_true", help="print the plan; run nothing heavy")
    p.add_argument("--only", help=f"comma-separated parts: {parts}")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--part", help=argparse.SUPPRESS)  # internal: run one part in this process
    p.add_argument("--part-out", type=Path, help=argparse.SUPPRESS)
    return p
