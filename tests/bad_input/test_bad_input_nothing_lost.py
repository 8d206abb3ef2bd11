"""Nothing already written is lost: a run refused after it starts leaves the earlier run in its
folder as it was (and does not call that run's checkpoint its own), a damaged training state is
refused before it truncates the log, an output inside an input folder (or naming a DOMAIN=PATH
data spec) is refused before any work, and a full disk while a file is saved is one line that
leaves the previous file and no temp file behind. Commands run in-process through `runpy`."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.bad_input import assert_one_line_error, digest, run_command

import smelt_interp.files as files
from smelt_interp.files import atomic_torch_save, atomic_write_many

TRAIN = "smelt_interp.train"
SINK = "smelt_interp.probes.sink"
REPORT = "smelt_interp.report"
DOWNSTREAM = "smelt_interp.analysis.downstream"
SMALL = ["--n-seqs", "2", "--seq-len", "16", "--demos", "0"]


def train(out: Path, *sets: str, resume: bool = False, data: list[Path] = ()) -> tuple[int, str]:
    """`python -m smelt_interp.train` on the tiny preset, Baseline only: (exit code, stderr)."""
    args: list[Any] = ["--preset", "dyck-pair-tiny", "--arch", "baseline", "--out", out, "--quiet"]
    for item in ("threads=1", "eval_every=1000", "dyck_eval_n=4", "warmup_steps=1", *sets):
        args += ["--set", item]
    for path in data:
        args += ["--data", path]
    if resume:
        args.append("--resume")
    code, _, err = run_command(TRAIN, *args)
    return code, err


def run_files(folder: Path) -> dict[str, str]:
    """{name: digest} of every file in a run folder but its lock."""
    return {
        p.name: digest(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".lock"
    }


@pytest.fixture
def earlier_run(tmp_path: Path) -> Path:
    """A finished two-step run in tmp_path/baseline (state, checkpoint and log)."""
    code, err = train(tmp_path, "steps=2", "ckpt_every=1")
    assert code == 0, err
    return tmp_path / "baseline"


def heldout_only_domain(tmp_path: Path) -> Path:
    """A JSONL whose domain 'mine' has one document, which the split holds out: the run finds
    no training document of it only once it starts drawing batches."""
    lines = [json.dumps({"text": f"some text number {i} here"}) for i in range(1, 7)]
    lines.append(json.dumps({"text": "mine only heldout", "domain": "mine"}))  # line 7: heldout
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


# ----- a run refused after it starts keeps the earlier run ----------------------------------------


@pytest.mark.parametrize(
    "case",
    ["diverges at step 1", "diverges before its first save", "a domain with no training documents"],
)
def test_a_failed_run_in_a_used_folder_keeps_the_earlier_run(
    earlier_run: Path, tmp_path: Path, case: str
) -> None:
    before = run_files(earlier_run)
    if case == "diverges at step 1":
        code, err = train(tmp_path, "steps=3", "lr=1e308")
    elif case == "diverges before its first save":
        code, err = train(tmp_path, "steps=60", "lr=30", "ckpt_every=1000")
    else:
        weights = '{"dyck": 0.5, "text": 0.25, "mine": 0.25}'
        code, err = train(
            tmp_path, "steps=3", f"data={weights}", data=[heldout_only_domain(tmp_path)]
        )
    assert_one_line_error(code, err)
    assert "last good checkpoint" not in err  # the checkpoint there is the earlier run's
    assert run_files(earlier_run) == before  # its log, state and checkpoint, byte for byte, and
    # no pending log of the failed run left beside them


def test_a_new_run_in_a_used_folder_replaces_the_earlier_log_at_its_first_save(
    earlier_run: Path, tmp_path: Path
) -> None:
    code, err = train(tmp_path, "steps=3", "ckpt_every=1", "seed=7")
    assert code == 0, err
    rows = [json.loads(line) for line in (earlier_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["event"] == "train"] == [1, 2, 3]  # only the new run's
    assert not [p for p in earlier_run.iterdir() if p.name.endswith(".tmp")]


# ----- a damaged training state is refused before the log is touched ------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        {"step": -5},
        {"step": -1},
        {"step": "2"},
        {"step": 1.5},
        {"step": True},
        {"branches_done": [-3]},
        {"branches_done": "x"},
        {"rng": [1, 2]},
    ],
)
def test_resume_refuses_a_damaged_state_and_keeps_the_log(
    earlier_run: Path, tmp_path: Path, damage: dict[str, Any]
) -> None:
    state_path = earlier_run / "state.pt"
    state = torch.load(state_path, weights_only=True)
    torch.save({**state, **damage}, state_path)
    log = digest(earlier_run / "metrics.jsonl")
    code, err = train(tmp_path, "steps=2", "ckpt_every=1", resume=True)
    assert_one_line_error(code, err, "state.pt", "cannot resume")
    assert digest(earlier_run / "metrics.jsonl") == log


# ----- an output inside what a command reads -----------------------------------------------------


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "f1.py").write_text("def f():\n    return ( 1 )\n" * 20)
    (folder / "f2.py").write_text("x = [ 2 ]\n" * 40)
    (folder / "sub" / "f3.md").write_text("some ( nested ) words\n" * 30)
    return folder


def output_in_data_cases(ckpt: Path, base: Path, corpus: Path) -> list[list[Any]]:
    named = corpus / "f2.py"
    return [
        [SINK, ckpt, "--data", corpus, "--json", corpus / "f2.py"],
        [SINK, ckpt, "--data", corpus, "--csv", corpus / "sub" / "new.csv"],
        [SINK, ckpt, "--data", f"mine={named}", "--json", named],
        [REPORT, ckpt, "--data", corpus, "--html", corpus / "f1.py"],
        [REPORT, ckpt, "--data", f"code={named}", "--json", named],
        [DOWNSTREAM, base, ckpt, "--data", f"dyck,{corpus}", "--json", corpus / "f2.py"],
        [DOWNSTREAM, base, ckpt, "--data", f"mine={named}", "--plot", named],
        [TRAIN, "eval", ckpt, "--data", corpus, "--json", corpus / "sub" / "f3.md"],
    ]


@pytest.mark.parametrize("index", range(8))
def test_an_output_inside_a_data_input_is_refused_before_any_work(
    tiny_pair: dict[str, Path], tmp_path: Path, corpus: Path, index: int
) -> None:
    ckpt, base = tiny_pair["smelt"], tiny_pair["baseline"]
    module, *args = output_in_data_cases(ckpt, base, corpus)[index]
    before = {p: digest(p) for p in corpus.rglob("*") if p.is_file()}
    code, _, err = run_command(module, *args, *(SMALL if module == SINK else []))
    assert_one_line_error(code, err, "input")
    assert {p: digest(p) for p in corpus.rglob("*") if p.is_file()} == before


# ----- a full disk ----------------------------------------------------------------------------


class FullFile:
    """A file on a full disk: `room` bytes are written, then write fails with ENOSPC."""

    def __init__(self, fh: Any, room: int) -> None:
        self.fh, self.room = fh, room

    def write(self, data: Any) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.fh.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fh, name)

    def __enter__(self) -> FullFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.fh.close()


class FullDisk:
    """Stands in for os.fdopen: the `fail_at`-th file opened for writing is a FullFile."""

    def __init__(self, fail_at: int = 1, room: int = 1000) -> None:
        self.real, self.fail_at, self.room, self.opened = os.fdopen, fail_at, room, 0

    def __call__(self, fd: int, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        fh = self.real(fd, mode, *args, **kwargs)
        if "w" not in mode:
            return fh
        self.opened += 1
        return FullFile(fh, self.room) if self.opened == self.fail_at else fh


@pytest.mark.parametrize("fail_at", [1, 2], ids=["state.pt", "ckpt.pt"])
def test_a_full_disk_while_saving_is_one_line_and_keeps_the_previous_files(
    earlier_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: int
) -> None:
    name = "state.pt" if fail_at == 1 else "ckpt.pt"  # a new run saves state.pt, then ckpt.pt
    before = digest(earlier_run / name)
    monkeypatch.setattr(files.os, "fdopen", FullDisk(fail_at=fail_at))
    code, err = train(tmp_path, "steps=2", "ckpt_every=1")
    monkeypatch.undo()
    assert_one_line_error(code, err, "no space left", name)
    assert digest(earlier_run / name) == before
    assert not [p for p in earlier_run.rglob("*") if p.name.endswith(".tmp")]
    torch.load(earlier_run / "state.pt", weights_only=True)  # still whole


def test_a_full_disk_in_any_atomic_write_is_one_disk_full_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = tmp_path / "old.json"
    old.write_text("kept")
    monkeypatch.setattr(files.os, "fdopen", FullDisk(room=10))
    with pytest.raises(files.DiskFullError, match="no space left"):
        atomic_torch_save({"x": torch.zeros(1000)}, tmp_path / "t.pt")
    monkeypatch.setattr(files.os, "fdopen", FullDisk(room=10))
    with pytest.raises(files.DiskFullError, match="old.json"):
        atomic_write_many({old: "x" * 100})
    assert old.read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]
