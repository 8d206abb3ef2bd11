"""Bad input to the commands' inputs and outputs: every bad input is one `error: ...` line and exit
code 2, refused before any work, and a command that fails leaves every file it would have
replaced as it was. Commands run in-process through `runpy`, exactly as `python -m` runs them
(tests/helpers/bad_input.py)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.bad_input import assert_one_line_error, digest, run_command
from hypothesis import given, settings
from hypothesis import strategies as st

import smelt_interp.files as files
from smelt_interp.analysis.downstream import compare_bytes
from smelt_interp.data import user_files
from smelt_interp.errors import ConfigError, DataError
from smelt_interp.files import atomic_write_many, check_outputs
from smelt_interp.probes.inputs import probe_bytes
from smelt_interp.resources import parse_device

SINK = "smelt_interp.probes.sink"
REPORT = "smelt_interp.report"
SCALING = "smelt_interp.analysis.scaling"
DOWNSTREAM = "smelt_interp.analysis.downstream"
SMALL = ["--n-seqs", "2", "--seq-len", "16", "--demos", "0"]  # probe runs that take no time


def runs_csv(path: Path, n: int = 8, scale: float = 1.0) -> Path:
    """A runs table the fit accepts (n rows), F and D multiplied by `scale`."""
    rows = [
        f"{scale * 1e9 * 2**i:g},{0.5 * (i % 2)},{scale * 1e10 * 3 ** (i % 3):g},{3.0 - 0.1 * i}"
        for i in range(n)
    ]
    path.write_text("F,S,D,loss\n" + "\n".join(rows) + "\n")
    return path


@pytest.fixture
def ckpt(tiny_pair: dict[str, Path], tmp_path: Path) -> Path:
    path = tmp_path / "s.pt"
    path.write_bytes(tiny_pair["smelt"].read_bytes())
    return path


@pytest.fixture
def base(tiny_pair: dict[str, Path], tmp_path: Path) -> Path:
    path = tmp_path / "b.pt"
    path.write_bytes(tiny_pair["baseline"].read_bytes())
    return path


@pytest.fixture
def blocker(tmp_path: Path) -> Path:
    """A plain file where a command's output folder would have to be."""
    path = tmp_path / "plain-file"
    path.write_text("x")
    return path


# ----- an output never overwrites an input, nor another output ------------------------------------


def output_over_input_cases(ckpt: Path, base: Path, runs: Path) -> list[tuple[str, list[Any]]]:
    return [
        (SINK, [ckpt, "--json", ckpt]),
        (SINK, [ckpt, "--csv", ckpt]),
        (SINK, [ckpt, "--compare", base, "--csv", base]),
        (REPORT, [ckpt, "--json", ckpt]),
        (REPORT, [ckpt, "--compare", base, "--html", base]),
        ("smelt_interp.train", ["eval", ckpt, "--json", ckpt]),
        (DOWNSTREAM, [base, ckpt, "--json", base]),
        (DOWNSTREAM, [base, ckpt, "--plot", ckpt]),
        (SCALING, [runs, "--plot", runs]),
        (SCALING, [runs, "--json", runs]),
        (SCALING, [runs, "--results", runs]),
    ]


def test_an_output_equal_to_an_input_is_refused_by_every_writer(
    ckpt: Path, base: Path, tmp_path: Path
) -> None:
    runs = runs_csv(tmp_path / "runs.csv")
    for module, args in output_over_input_cases(ckpt, base, runs):
        before = {p: digest(p) for p in (ckpt, base, runs)}
        code, _, err = run_command(module, *args)
        assert_one_line_error(code, err, "input")
        assert {p: digest(p) for p in before} == before, (module, args)


def test_a_csv_sibling_table_equal_to_the_checkpoint_is_refused(tiny_pair, tmp_path) -> None:
    """`--csv o.csv` also writes `o.visits.csv` (the sink probe's second table)."""
    victim = tmp_path / "o.visits.csv"
    victim.write_bytes(tiny_pair["smelt"].read_bytes())
    before = digest(victim)
    code, _, err = run_command(SINK, victim, "--csv", tmp_path / "o.csv")
    assert_one_line_error(code, err, "input", "o.visits.csv")
    assert digest(victim) == before


def test_an_input_reached_through_a_symlink_or_hard_link_is_refused(ckpt, tmp_path) -> None:
    (tmp_path / "link.pt").symlink_to(ckpt)
    os.link(ckpt, tmp_path / "hard.pt")
    before = digest(ckpt)
    for alias in ("link.pt", "hard.pt", "./sub/../s.pt"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        code, _, err = run_command(SINK, ckpt, "--json", tmp_path / alias)
        assert_one_line_error(code, err, "input")
    assert digest(ckpt) == before


def test_two_outputs_naming_one_file_are_refused(ckpt, tmp_path) -> None:
    out = tmp_path / "o.json"
    for module, args in [
        (SINK, [ckpt, "--json", out, "--csv", out]),
        (REPORT, [ckpt, "--json", out, "--html", out]),
        (SCALING, [runs_csv(tmp_path / "runs.csv"), "--json", out, "--plot", out]),
        (SCALING, [runs_csv(tmp_path / "runs.csv"), "--json", out, "--results", out]),
    ]:
        code, _, err = run_command(module, *args)
        assert_one_line_error(code, err, "same file")
    assert not out.exists()


def test_a_results_file_that_cannot_be_written_is_refused_before_any_work(tmp_path, blocker):
    """`--results` under a plain file: one line, and the ladder trains nothing."""
    ladder = tmp_path / "ladder"
    for module, args in [
        ("smelt_interp.budget", ["--results", blocker / "b.md"]),
        (
            "smelt_interp.train",
            ["ladder", "--sizes", "1", "--out", ladder, "--results", blocker / "l.md"],
        ),
    ]:
        code, _, err = run_command(module, *args)
        assert_one_line_error(code, err, "plain-file")
    assert not ladder.exists()


# ----- all outputs or none ------------------------------------------------------------------------


def test_atomic_write_many_renames_nothing_when_one_target_fails(tmp_path, blocker) -> None:
    first = tmp_path / "a.txt"
    first.write_text("old")
    with pytest.raises(OSError):
        atomic_write_many({first: "new", blocker / "b.txt": "new"})
    assert first.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "plain-file"]  # no temp left
    atomic_write_many({first: "new", tmp_path / "b.txt": "b"})
    assert first.read_text() == "new" and (tmp_path / "b.txt").read_text() == "b"


def test_a_report_that_fails_writing_leaves_its_old_outputs(ckpt, tmp_path, monkeypatch) -> None:
    """A full disk while writing the HTML: the JSON, written first, is not replaced either."""
    old_json, old_html = tmp_path / "k.json", tmp_path / "k.html"
    old_json.write_text("old json")
    old_html.write_text("old html")
    write_temp = files._write_temp

    def disk_full_on_html(path: Path, write):
        if path.suffix == ".html":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return write_temp(path, write)

    monkeypatch.setattr(files, "_write_temp", disk_full_on_html)
    code, _, err = run_command(REPORT, ckpt, *SMALL, "--json", old_json, "--html", old_html)
    assert_one_line_error(code, err, "no space left")
    assert old_json.read_text() == "old json" and old_html.read_text() == "old html"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.html", "k.json", "s.pt"]


@pytest.mark.skipif(not os.path.isdir("/sys"), reason="needs a Linux /sys")
def test_report_into_sys_exits_2_without_replacing_the_json(ckpt, tmp_path) -> None:
    """`report --json k.json --html /sys/x.html`: an output that cannot be written."""
    old_json = tmp_path / "k.json"
    old_json.write_text("old")
    code, _, err = run_command(REPORT, ckpt, *SMALL, "--json", old_json, "--html", "/sys/x.html")
    assert_one_line_error(code, err, "/sys")
    assert old_json.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.json", "s.pt"]


def test_probe_csv_and_json_are_written_together(ckpt, tmp_path) -> None:
    code, _, err = run_command(
        SINK, ckpt, *SMALL, "--csv", tmp_path / "o.csv", "--json", tmp_path / "o.json"
    )
    assert code == 0, err
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["o.csv", "o.json", "o.visits.csv", "s.pt"]


# ----- one device parser --------------------------------------------------------------------------

BAD_DEVICES = ["meta", "mps", "cuda:7", "foo", "cuda/foo", "", "cpu:x", "xla"]
if not torch.cuda.is_available():
    BAD_DEVICES.append("cuda")


@pytest.mark.parametrize("device", BAD_DEVICES)
def test_probe_devices_that_cannot_run_give_one_line(ckpt: Path, device: str) -> None:
    code, _, err = run_command(SINK, ckpt, "--device", device)
    assert_one_line_error(code, err, "--device")


def test_report_uses_the_same_device_parser(ckpt: Path) -> None:
    code, _, err = run_command(REPORT, ckpt, "--device", "meta")
    assert_one_line_error(code, err, "--device", "meta")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12) | st.sampled_from(["cpu", "cuda", "cuda:0", "cpu:0", "meta", "mps"]))
def test_parse_device_gives_a_runnable_device_or_a_config_error(text: str) -> None:
    try:
        device = parse_device(text)
    except ConfigError as exc:
        assert "\n" not in str(exc) and "--device" in str(exc)
        return
    assert device.type == "cpu" or (device.type == "cuda" and torch.cuda.is_available())
    torch.zeros(1, device=device)  # accepted means a tensor can live there


# ----- data files are bounded and regular ---------------------------------------------------------


def test_unbounded_data_file_is_refused_with_one_line(ckpt: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", SINK, str(ckpt), "--data", "/dev/zero"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert_one_line_error(proc.returncode, proc.stderr, "/dev/zero", "regular file")


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="not a regular file"):
        user_files.path_documents(fifo)
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "folder" / "pipe.txt")
    with pytest.raises(DataError, match="pipe.txt: not a regular file"):
        user_files.path_documents(tmp_path / "folder")


def test_a_file_past_the_cap_is_refused_naming_it(ckpt, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(user_files, "MAX_FILE_BYTES", 1000)
    big = tmp_path / "big.txt"
    big.write_text("a" * 1001)
    code, _, err = run_command(SINK, ckpt, "--data", big)
    assert_one_line_error(code, err, "big.txt", "larger than")
    big.write_text("a ( ) b\n" * 100)  # 800 bytes: under the cap, read as before
    assert user_files.path_documents(big)[0].text.startswith("a ( ) b")


def test_the_cap_is_64_mib() -> None:
    assert user_files.MAX_FILE_BYTES == 64 * 2**20


# ----- an output whose parent is a file -----------------------------------------------------------


def test_outputs_under_a_file_give_one_line(ckpt, base, tmp_path, blocker) -> None:
    runs = runs_csv(tmp_path / "runs.csv")
    under = blocker / "sub" / "o.out"
    for module, args in [
        (SINK, [ckpt, "--json", under]),
        (SINK, [ckpt, "--csv", under]),
        (REPORT, [ckpt, "--html", under]),
        ("smelt_interp.train", ["eval", ckpt, "--json", under]),
        (DOWNSTREAM, [base, ckpt, "--plot", under]),
        (SCALING, [runs, "--json", under]),
    ]:
        code, _, err = run_command(module, *args)
        assert_one_line_error(code, err, "plain-file", "not a folder")
    assert blocker.read_text() == "x"


def test_an_output_that_is_a_folder_or_a_device_gives_one_line(ckpt, tmp_path) -> None:
    code, _, err = run_command(SINK, ckpt, "--json", tmp_path)
    assert_one_line_error(code, err, "is a folder")
    code, _, err = run_command(SINK, ckpt, "--json", "/dev/null")  # never renamed over
    assert_one_line_error(code, err, "/dev/null", "not a regular file")
    assert Path("/dev/null").is_char_device()


@settings(max_examples=100, deadline=None)
@given(
    ins=st.lists(st.sampled_from("abcd"), max_size=3),
    outs=st.lists(st.sampled_from("abcdef"), max_size=3),
)
def test_check_outputs_refuses_exactly_the_clashes(tmp_path_factory, ins, outs) -> None:
    root = tmp_path_factory.mktemp("clash")
    for name in ins:
        (root / name).write_text(name)
    inputs = {f"IN{i}": root / n for i, n in enumerate(ins)}
    outputs = {f"--out{i}": root / "." / n for i, n in enumerate(outs)}
    clash = bool(set(ins) & set(outs)) or len(set(outs)) < len(outs)
    if clash:
        with pytest.raises(ConfigError):
            check_outputs(inputs, outputs)
    else:
        check_outputs(inputs, outputs)
    assert sorted(p.name for p in root.iterdir()) == sorted(set(ins))  # nothing written


# ----- the scaling fit on degenerate tables; seeds ------------------------------------------------


@pytest.mark.parametrize(
    "text, args, needle",
    [
        ("F,S,D,loss\n", [], "runs"),
        ("F,S,D,loss,arch\n", [], "no rows"),
        (None, ["--seed", "-1"], "--seed"),
        ("huge", [], "above"),
        ("F,S,D,loss\n" + "1e9,0,1e9,1e300\n" * 8, [], "loss"),
        (None, ["--fix-b", "1e300"], "fix_b"),
        (None, ["--fix-b", "nan"], "fix_b"),
    ],
)
def test_scaling_on_degenerate_tables_gives_one_line(tmp_path, text, args, needle) -> None:
    runs = tmp_path / "runs.csv"
    if text == "huge":
        runs_csv(runs, scale=1e290)  # F*D overflows to inf
    elif text is None:
        runs_csv(runs)
    else:
        runs.write_text(text)
    code, _, err = run_command(SCALING, runs, "--bootstrap", "2", *args)
    assert_one_line_error(code, err, needle)


# ----- counts that mean nothing or cannot fit -----------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--n-docs", "-1"],
        ["--n-docs", "0"],
        ["--bootstrap", "-1"],
        ["--seed", "-1"],
        ["--n-dyck", "-5"],
    ],
)
def test_downstream_counts_must_be_meaningful(base: Path, ckpt: Path, args: list[str]) -> None:
    code, _, err = run_command(DOWNSTREAM, base, ckpt, *args)
    assert_one_line_error(code, err, args[0])


def test_probe_work_that_cannot_fit_in_memory_is_refused_up_front(ckpt, tmp_path) -> None:
    outs = ["--json", tmp_path / "o.json"]
    for module, more in ((SINK, []), (REPORT, ["--html", tmp_path / "o.html"])):
        code, _, err = run_command(module, ckpt, "--n-seqs", "100000000", *outs, *more)
        assert_one_line_error(code, err, "memory", "GiB")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.pt"]


def test_downstream_counts_that_cannot_fit_in_memory_are_refused(base, ckpt, tmp_path) -> None:
    for flag in ("--n-docs", "--n-dyck"):
        code, _, err = run_command(DOWNSTREAM, base, ckpt, flag, "100000000")
        assert_one_line_error(code, err, flag, "memory", "GiB")
    assert compare_bytes(64, 3, 64, 200) < 2**30


def test_probe_memory_estimate_grows_with_the_work(tiny_cfg) -> None:
    small = probe_bytes([tiny_cfg], 16, 64, 4, 8)
    assert 0 < small < 2**30 < probe_bytes([tiny_cfg], 100_000_000, 64, 4, 8)
    assert probe_bytes([tiny_cfg], 32, 64, 4, 8) > small
