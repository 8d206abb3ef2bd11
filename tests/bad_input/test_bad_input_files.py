"""Every file input is checked before it is read, and what it holds is input too: a FIFO, a
device, a folder or a file past its cap is one `error:` line (never a hang: commands that could
block run in a child process with a timeout and a memory cap); JSON nested without bound or an
integer past the parser's limit is one line wherever it is parsed; a checkpoint's metadata
cannot crash a loader nor choose which files a command reads; and a tree of run folders of any
depth is searched."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.bad_input import assert_one_line_error, run_bounded, run_command

import smelt_interp.data.sources as sources
from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.errors import CheckpointError, ConfigError, DataError
from smelt_interp.files import find_files, open_input, parse_json, read_input_bytes

TRAIN = "smelt_interp.train"
SINK = "smelt_interp.probes.sink"
SCALING = "smelt_interp.analysis.scaling"
TINY = ["--preset", "dyck-pair-tiny", "--arch", "baseline", "--quiet", "--set", "threads=1"]


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


# ----- file inputs that are not regular files -----------------------------------------------------


def not_regular_cases(tmp_path: Path, run: Path) -> dict[str, tuple[str, list[Any], str]]:
    """{case: (module, args, a needle of the one line)}; each would block or read without end
    if opened as a plain file."""
    folder = tmp_path / "a-folder"
    folder.mkdir()
    return {
        "--config FIFO": (TRAIN, [*TINY, "--config", fifo(tmp_path / "c.json")], "c.json"),
        "--config /dev/zero": (TRAIN, [*TINY, "--config", "/dev/zero"], "/dev/zero"),
        "--config folder": (TRAIN, [*TINY, "--config", folder], "folder"),
        ".lock FIFO": (TRAIN, [*TINY, "--out", run], ".lock"),
        "state.pt FIFO": (TRAIN, [*TINY, "--out", run, "--resume"], "state.pt"),
        "metrics.jsonl FIFO": (TRAIN, [*TINY, "--out", run, "--resume"], "metrics.jsonl"),
        "runs CSV FIFO": (SCALING, [fifo(tmp_path / "runs.csv")], "runs.csv"),
        "runs CSV /dev/zero": (SCALING, ["/dev/zero"], "/dev/zero"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "--config FIFO",
        "--config /dev/zero",
        "--config folder",
        ".lock FIFO",
        "state.pt FIFO",
        "metrics.jsonl FIFO",
        "runs CSV FIFO",
        "runs CSV /dev/zero",
    ],
)
def test_an_input_that_is_not_a_regular_file_is_one_line_without_blocking(
    tmp_path: Path, case: str
) -> None:
    run = tmp_path / "run"
    if case.startswith((".lock", "state.pt", "metrics.jsonl")):
        fifo(run / "baseline" / case.split()[0])
    module, args, needle = not_regular_cases(tmp_path, run)[case]
    code, _, err = run_bounded(module, *args, timeout=150)
    assert_one_line_error(code, err, needle)


@pytest.mark.parametrize("kind", ["fifo", "folder", "device", "missing", "too big"])
def test_open_input_checks_the_file_before_reading(tmp_path: Path, kind: str) -> None:
    path = {
        "fifo": lambda: fifo(tmp_path / "p"),
        "folder": lambda: tmp_path,
        "device": lambda: Path("/dev/zero"),
        "missing": lambda: tmp_path / "nope",
        "too big": lambda: (tmp_path / "big").write_bytes(b"x" * 101) and tmp_path / "big",
    }[kind]()
    with pytest.raises(DataError, match=str(path)):
        open_input(path, 100, DataError, "data file")


def test_a_file_that_grows_past_its_cap_while_read_is_refused(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "grows.txt"
    path.write_bytes(b"x" * 50)
    real = os.fstat

    def smaller(fd: int) -> os.stat_result:  # fstat ran before the file grew
        info = real(fd)
        return os.stat_result((*info[:6], 10, *info[7:]))

    monkeypatch.setattr(os, "fstat", smaller)
    with pytest.raises(ConfigError, match="larger than 20 bytes"):
        read_input_bytes(path, 20)


# ----- parsed values within the parser's bounds ---------------------------------------------------

DEEP_LIST = "[" * 50_000 + "]" * 50_000
DEEP_DICT = '{"a":' * 50_000 + "1" + "}" * 50_000
HUGE_INT = "7" * 5_000
NESTED_100 = "[" * 100 + "]" * 100  # parses, but deeper than any config
PARSER_BREAKERS = [DEEP_LIST, DEEP_DICT, HUGE_INT, NESTED_100]
BREAKER_IDS = ["list 50k deep", "object 50k deep", "5,000 digits", "100 deep"]


@pytest.mark.parametrize("value", PARSER_BREAKERS, ids=BREAKER_IDS)
@pytest.mark.parametrize("key", ["steps", "dyck", "model.d_model"])
def test_a_set_value_the_parser_cannot_hold_is_one_line(tmp_path: Path, key: str, value: str):
    code, _, err = run_command(TRAIN, *TINY, "--out", tmp_path, "--set", f"{key}={value}")
    assert_one_line_error(code, err, f"--set {key}", "JSON")
    assert len(err) < 300 and not (tmp_path / "baseline").exists()


@pytest.mark.parametrize("value", PARSER_BREAKERS, ids=BREAKER_IDS)
@pytest.mark.parametrize("where", ["whole file", "a field"])
def test_a_config_file_the_parser_cannot_hold_is_one_line(tmp_path: Path, value: str, where):
    config = tmp_path / "c.json"
    config.write_text(value if where == "whole file" else f'{{"steps": 2, "dyck": {value}}}')
    code, _, err = run_command(TRAIN, *TINY, "--out", tmp_path, "--config", config)
    assert_one_line_error(code, err, "c.json", "JSON")


@pytest.mark.parametrize("value", PARSER_BREAKERS[:3], ids=BREAKER_IDS[:3])
@pytest.mark.parametrize("module", [TRAIN, SINK])
def test_a_jsonl_line_the_parser_cannot_hold_is_one_line_naming_it(
    tmp_path: Path, tiny_pair: dict[str, Path], value: str, module: str
) -> None:
    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps({"text": "fine ( )"}) + "\n" + f'{{"text": "x", "n": {value}}}\n')
    args = [*TINY, "--out", tmp_path] if module == TRAIN else [tiny_pair["smelt"]]
    code, _, err = run_command(module, *args, "--data", data)
    assert_one_line_error(code, err, "docs.jsonl:2", "JSON")


@pytest.mark.parametrize("text", ["[1, [2, {}]]", '{"a": {"b": [1, 2.5, "x"]}}', "123456789"])
def test_parse_json_leaves_ordinary_json_as_json_loads_reads_it(text: str) -> None:
    assert parse_json(text, "x") == json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        parse_json(text + "}", "x")


# ----- a checkpoint's metadata --------------------------------------------------------------------


def edited(src: Path, dst: Path, edit) -> Path:
    payload = torch.load(src, weights_only=True)
    edit(payload)
    torch.save(payload, dst)
    return dst


def int_key(payload: dict) -> None:
    payload["state_dict"][7] = payload["state_dict"].pop(next(iter(payload["state_dict"])))


def tuple_key(payload: dict) -> None:
    payload["state_dict"][(1, 2)] = torch.zeros(1)


def complex_weight(payload: dict) -> None:
    name = next(k for k, v in payload["state_dict"].items() if v.is_floating_point())
    payload["state_dict"][name] = payload["state_dict"][name].to(torch.complex64)


def complex_buffer(payload: dict) -> None:
    name = [k for k, v in payload["state_dict"].items() if v.is_floating_point()][-1]
    payload["state_dict"][name] = payload["state_dict"][name] * (1 + 1j)


@pytest.mark.parametrize("edit", [int_key, tuple_key, complex_weight, complex_buffer])
@pytest.mark.parametrize("module", [SINK, "smelt_interp.report", TRAIN])
def test_weights_that_are_not_named_real_tensors_are_one_line(
    tiny_pair: dict[str, Path], tmp_path: Path, edit, module: str
) -> None:
    bad = edited(tiny_pair["smelt"], tmp_path / "bad.pt", edit)
    with pytest.raises(CheckpointError, match="bad.pt"):
        load_checkpoint(bad)
    args = ["eval", bad] if module == TRAIN else [bad, "--json", tmp_path / "r.json"]
    code, _, err = run_command(module, *args)
    assert_one_line_error(code, err, "bad.pt")


@pytest.fixture
def ckpt_naming_a_file(tiny_pair: dict[str, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A checkpoint whose train_config trains on user text from a file it names."""
    named = tmp_path / "named"
    named.mkdir()
    for i in range(40):  # enough documents that the split holds some out
        (named / f"doc{i}.txt").write_text(f"words {i} from a file the checkpoint names ( ) " * 20)

    def edit(payload: dict) -> None:
        train_config = payload["meta"]["train_config"]
        train_config["data_paths"] = [str(named)]
        train_config["data"] = {**train_config["data"], "text": 0.25}

    return edited(tiny_pair["smelt"], tmp_path / "named.pt", edit), named


def test_train_eval_reads_no_file_a_checkpoint_names(ckpt_naming_a_file, monkeypatch) -> None:
    ckpt, named = ckpt_naming_a_file
    opened: list[str] = []
    real = sources.path_documents
    monkeypatch.setattr(
        sources, "path_documents", lambda p, **kw: opened.append(p) or real(p, **kw)
    )
    code, out, err = run_command(TRAIN, "eval", ckpt, "--n", "4", "--loss-rows", "2")
    assert code == 0, err
    assert opened == [] and "loss/text" not in out and "not read" in out
    code, out, err = run_command(
        TRAIN, "eval", ckpt, "--n", "4", "--loss-rows", "2", "--data", named
    )
    assert code == 0, err
    assert opened == [str(named)] and "loss/text" in out  # the file the user passed


def test_train_eval_never_reads_a_system_file_a_checkpoint_names(
    tiny_pair: dict[str, Path], tmp_path: Path, monkeypatch
) -> None:
    def edit(payload: dict) -> None:
        payload["meta"]["train_config"]["data_paths"] = ["/etc/passwd", "/dev/zero"]
        payload["meta"]["train_config"]["data"] = {"dyck": 1.0, "text": 0.5}

    ckpt = edited(tiny_pair["smelt"], tmp_path / "sys.pt", edit)
    monkeypatch.setattr(sources, "path_documents", lambda *a, **k: pytest.fail(f"read {a}"))
    code, out, err = run_command(TRAIN, "eval", ckpt, "--n", "4", "--loss-rows", "2")
    assert code == 0, err
    assert "/etc/passwd" in out and "not read" in out


# ----- a tree of any depth ---------------------------------------------------------------------


def remove_deep(root: Path) -> None:
    """Remove a folder tree of any depth one level at a time (shutil.rmtree recurses, and so
    would pytest's own clean-up of tmp_path: past ~1,000 levels both fail)."""
    base = Path.cwd()
    os.chdir(root)
    depth = 0
    try:
        while True:
            entries = list(os.scandir("."))
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    os.unlink(entry.name)
            folders = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
            if folders:
                os.chdir(folders[0])
                depth += 1
            elif depth == 0:
                break
            else:
                name = Path.cwd().name
                os.chdir("..")
                depth -= 1
                os.rmdir(name)
    finally:
        os.chdir(base)
    os.rmdir(root)


@pytest.mark.parametrize("depth", [3, 1_100])
def test_run_folders_are_found_at_any_depth(tmp_path: Path, depth: int) -> None:
    from smelt_interp.app.registry import find_checkpoints

    old = os.getcwd()
    os.chdir(tmp_path)
    try:  # relative paths: 1,100 levels of "d/" stay under PATH_MAX
        deep = Path("root", *["d"] * depth)
        os.mkdir("root")
        os.chdir("root")
        for _ in range(depth):  # one level at a time: os.makedirs recurses too
            os.mkdir("d")
            os.chdir("d")
        Path("ckpt.pt").write_bytes(b"x")
        os.chdir(tmp_path)
        (Path("root") / "ckpt.pt").mkdir()  # a folder of that name is not a checkpoint
        assert find_files("root", "ckpt.pt") == [deep / "ckpt.pt"]
        assert list(find_checkpoints(["root"]).values()) == [deep / "ckpt.pt"]
    finally:
        os.chdir(tmp_path)
        if Path("root").exists():
            remove_deep(tmp_path / "root")
        os.chdir(old)
    assert not (tmp_path / "root").exists()


# ----- the caps --------------------------------------------------------------------------------


@pytest.mark.parametrize("padding", [2**20, 2**21])
def test_a_config_file_past_1_mib_is_refused_before_it_is_parsed(tmp_path: Path, padding: int):
    config = tmp_path / "big.json"
    config.write_text('{"steps": 2, "notes": "' + "x" * padding + '"}')
    code, _, err = run_command(TRAIN, *TINY, "--out", tmp_path, "--config", config)
    assert_one_line_error(code, err, "big.json", "1 MiB")


@pytest.mark.parametrize("module", [SINK, TRAIN])
def test_a_checkpoint_larger_than_memory_is_refused_before_it_is_read(
    tiny_pair: dict[str, Path], monkeypatch, module: str
) -> None:
    import smelt_interp.checkpoint as checkpoint

    size = tiny_pair["smelt"].stat().st_size
    monkeypatch.setattr(checkpoint, "memory_limit_bytes", lambda: size - 1)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("read past the cap"))
    code, _, err = run_command(module, *(["eval"] if module == TRAIN else []), tiny_pair["smelt"])
    assert_one_line_error(code, err, "ckpt.pt", "larger than")
