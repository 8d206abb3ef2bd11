"""Bad input to the command-line tools at their limits: the seeds command's metrics logs (a FIFO,
a link to /dev/zero, a torn or damaged line), its counts (seeds, rows, depth, rows too short to
score) refused before any training; readme_figures' marker parser (linear, unclosed markers and
marker lines inside a table refused, a linked README kept a link); the case study and the head
ablation on rows with no answer position; `python -m smelt_interp.probes` with a relative
module; training resumed without a state, an `early` that is a file, and eval_rows past its cap.
Every failure is one `error:` line with exit code 2; a command that could hang runs in a child
process with a timeout."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers.bad_input import assert_one_line_error, digest, run_bounded, run_command

from smelt_interp.commands.readme_figures import BLOCK_CLOSE, BLOCK_OPEN
from smelt_interp.commands.run_log import train_seconds
from smelt_interp.commands.seed_runs import run_configs
from smelt_interp.errors import ConfigError, ResultsError
from smelt_interp.probes.head_ablation import ablate_checkpoint
from smelt_interp.results import marked_blocks, results_text, table_block
from smelt_interp.train.build import build_config
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import get_preset
from smelt_interp.train.trainer import Trainer

SEEDS = "smelt_interp.commands.seeds"
TRAIN_SETS = ["steps=4", "ckpt_every=2", "threads=1"]
RECALL = ["--preset", "recall-pair-tiny", *[x for s in TRAIN_SETS for x in ("--set", s)]]
RECALL += ["--seeds", "1", "--quiet"]
ROWS = ["--n-rows", "6", "--seq-len", "64"]


# ----- a complete recall seed, trained once ------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seeds command's folder holding seed 0 of recall-pair-tiny, both models complete."""
    out = tmp_path_factory.mktemp("seeds") / "out"
    base = build_config("recall-pair-tiny", None, TRAIN_SETS)
    for run in run_configs(base, 1, out):
        Trainer(run.cfg, run.folder, progress=False).run()
    return out


@pytest.fixture
def runs(trained: Path, tmp_path: Path) -> Path:
    """A copy of the trained seed folder this test may damage."""
    return Path(shutil.copytree(trained, tmp_path / "out", symlinks=True))


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any Trainer built fails the test: the command must refuse before training."""

    def refuse(self: Trainer, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a run was trained before the input was refused")

    monkeypatch.setattr(Trainer, "__init__", refuse)


def metrics_of(runs: Path) -> Path:
    return runs / "seed-0" / "baseline" / "metrics.jsonl"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder"])
def test_seeds_reads_a_reused_runs_log_as_a_checked_input(runs: Path, kind: str) -> None:
    log = metrics_of(runs)
    log.unlink()
    if kind == "fifo":
        os.mkfifo(log)  # a plain open() blocks here forever
    elif kind == "dev-zero":
        log.symlink_to("/dev/zero")  # a plain read grows without bound
    else:
        log.mkdir()
    code, _, err = run_bounded(SEEDS, *RECALL, *ROWS, "--out", runs, timeout=120)
    assert_one_line_error(code, err, "metrics.jsonl")
    assert not (runs / "seeds.json").exists()


def train_lines(log: Path) -> tuple[list[str], int]:
    lines = log.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if json.loads(line).get("event") == "train")
    return lines, first


@pytest.mark.parametrize(
    "value", ['"fast"', "true", "NaN", "Infinity", "-5", "0", "[1]", '{"a": 1}']
)
def test_seeds_refuses_a_tokens_per_s_that_is_no_positive_number(
    runs: Path, value: str, no_training: None
) -> None:
    log = metrics_of(runs)
    lines, first = train_lines(log)
    record = json.loads(lines[first])
    lines[first] = json.dumps(record | {"tokens_per_s": "@"}).replace('"@"', value)
    log.write_text("\n".join(lines) + "\n")
    code, _, err = run_command(SEEDS, *RECALL, *ROWS, "--out", runs)
    assert_one_line_error(code, err, "metrics.jsonl", f"line {first + 1}", "tokens_per_s")


@pytest.mark.parametrize(
    "damage", ["garbage", "[" * 100_000 + "]" * 100_000, '{"event": "train"', "[1, 2]"]
)
def test_seeds_refuses_a_damaged_log_line_in_one_line(
    runs: Path, damage: str, no_training: None
) -> None:
    log = metrics_of(runs)
    lines, first = train_lines(log)
    lines.insert(first, damage)  # not the last line: not a torn write
    log.write_text("\n".join(lines) + "\n")
    code, _, err = run_command(SEEDS, *RECALL, *ROWS, "--out", runs)
    assert_one_line_error(code, err, "metrics.jsonl", f"line {first + 1}")


@pytest.mark.parametrize("torn", ['{"event": "train", "tokens_per_s"', "{", '{"step": 9, "lo'])
def test_a_torn_last_log_line_is_skipped(runs: Path, torn: str) -> None:
    log = metrics_of(runs)
    cfg = build_config("recall-pair-tiny", None, TRAIN_SETS)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    speeds = [r["tokens_per_s"] for r in records if r.get("event") == "train"]
    assert speeds  # the run logged its steps' speeds
    by_hand = sum(cfg.tokens_per_step / s for s in speeds)
    assert train_seconds(log.parent, cfg) == pytest.approx(by_hand)
    with log.open("a") as fh:
        fh.write(torn)  # a kill mid-append: no newline
    assert train_seconds(log.parent, cfg) == pytest.approx(by_hand)


@pytest.mark.parametrize("seeds", ["1001", "100000000", str(10**15)])
def test_seeds_past_the_cap_are_refused_before_any_config_is_built(tmp_path, seeds) -> None:
    out = tmp_path / "o"
    code, _, err = run_bounded(SEEDS, *RECALL[:-3], "--seeds", seeds, "--out", out, timeout=90)
    assert_one_line_error(code, err, "--seeds", "1,000")
    assert not out.exists()


@pytest.mark.parametrize(("rows", "length"), [("100000000", "64"), (str(10**12), "8")])
def test_seeds_rows_past_memory_are_refused_before_training(
    tmp_path: Path, rows: str, length: str, no_training: None
) -> None:
    out = tmp_path / "o"
    code, _, err = run_command(SEEDS, *RECALL, "--n-rows", rows, "--seq-len", length, "--out", out)
    assert_one_line_error(code, err, f"--n-rows {rows}", "memory")
    assert not out.exists()


@pytest.mark.parametrize("depth", ["65537", "70000", str(10**9)])
def test_seeds_max_depth_out_of_range_is_refused_before_training(
    tmp_path: Path, depth: str, no_training: None
) -> None:
    out = tmp_path / "o"
    args = ["--preset", "dyck-pair-tiny", "--seeds", "1", "--max-depth", depth, "--quiet"]
    code, _, err = run_command(SEEDS, *args, "--out", out)
    assert_one_line_error(code, err, "max_depth")
    assert not out.exists()


@pytest.mark.parametrize(("rows", "length"), [("2", "6"), ("6", "3"), ("64", "2")])
def test_seeds_rows_with_no_answer_position_are_refused_before_training(
    tmp_path: Path, rows: str, length: str, no_training: None
) -> None:
    out = tmp_path / "o"
    code, _, err = run_command(SEEDS, *RECALL, "--n-rows", rows, "--seq-len", length, "--out", out)
    assert_one_line_error(code, err, "answer", f"of {length} tokens")
    assert not out.exists()


# ----- the case study and the head ablation on short rows --------------------------------------
@pytest.mark.parametrize(("length", "rows"), [("2", "16"), ("3", "16"), ("6", "1"), ("8", "1")])
def test_case_study_on_rows_with_no_answer_position_is_one_line(trained, length, rows) -> None:
    ckpt = trained / "seed-0" / "smelt" / "ckpt.pt"
    args = ["case_study", ckpt, "--seq-len", length, "--n-seqs", rows]
    code, _, err = run_command("smelt_interp.probes", *args)
    assert_one_line_error(code, err, "no answer position", f"of {length} tokens")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["ANYTHING"], "no such checkpoint"),
        ([], "required"),
        (["/nonexistent/x.pt", "--n-rows", "3"], "no such checkpoint"),
        (["{ckpt}", "--n-rows", "0"], ">= 1"),
        (["{ckpt}", "--n-rows", "2", "--seq-len", "6"], "no answer with an earlier"),
        (["{ckpt}", "--n-rows", str(10**9)], "memory"),
    ],
)
def test_head_ablation_as_a_command_refuses_bad_input(trained, args, needle) -> None:
    ckpt = trained / "seed-0" / "smelt" / "ckpt.pt"
    args = [str(ckpt) if a == "{ckpt}" else a for a in args]
    code, _, err = run_command("smelt_interp.probes.head_ablation", *args)
    assert_one_line_error(code, err, needle)


def test_head_ablation_as_a_command_prints_the_ablation(trained) -> None:
    ckpt = trained / "seed-0" / "smelt" / "ckpt.pt"
    args = [ckpt, "--n-rows", "6", "--seq-len", "64"]
    code, out, err = run_command("smelt_interp.probes.head_ablation", *args)
    assert code == 0, err
    table = ablate_checkpoint(ckpt, n_rows=6, seq_len=64).table
    lines = out.splitlines()
    assert len(lines) == 1 + len(table)  # the header, then one line per run
    for line, (_, row) in zip(lines[1:], table.iterrows()):
        assert line.strip().startswith(row["run"])
        for col in ("answer_acc", "non_answer_loss"):  # NaN: a run that ablated nothing
            assert (f"{row[col]:.4f}" if row[col] == row[col] else "NaN") in line


@pytest.mark.parametrize("name", [":PROBE", ".mine:PROBE", "..pkg.mod:ATTR", ".:X"])
def test_a_probe_named_by_an_empty_or_relative_module_is_one_line(tmp_path, name) -> None:
    code, _, err = run_command("smelt_interp.probes", name, tmp_path / "x.pt")
    assert_one_line_error(code, err, "module")


# ----- readme_figures -----------------------------------------------------------------------
TABLE = "| a | b |\n| --- | --- |\n| x | 0.125 |"


def results_root(tmp_path: Path, table: str = TABLE, extra: str = "") -> Path:
    folder = tmp_path / "docs" / "results"
    folder.mkdir(parents=True)
    text = results_text("T", "python -m x", [table_block("t", table), extra], "abc1234")
    (folder / "r.md").write_text(text, encoding="utf-8")
    return tmp_path


def readme_text(table: str) -> str:
    return f"# t\n\n## S\n\n<!-- results: docs/results/r.md#t -->\n{table}\n<!-- /results -->\n"


def tool(readme: Path, *args: str, timeout: float = 120) -> tuple[int, str, str]:
    return run_bounded(
        "smelt_interp.commands.readme_figures", *args, "--readme", readme, timeout=timeout
    )


UNCLOSED = "<!-- results: docs/results/r.md#t -->\nx\n"


@pytest.mark.parametrize(
    ("readme", "needle"),
    [
        (UNCLOSED * 40_000, "line 1"),  # ~1.5 MB of unclosed markers: one pass, one line
        (readme_text(TABLE) + UNCLOSED * 40_000, "line 10"),
        (UNCLOSED + readme_text(TABLE), "line 1"),  # opened again before it closed
    ],
)
def test_an_unclosed_readme_marker_is_one_line_in_one_pass(tmp_path, readme, needle) -> None:
    root = results_root(tmp_path)
    (root / "README.md").write_text(readme, encoding="utf-8")
    before = digest(root / "README.md")
    code, _, err = tool(root / "README.md", timeout=60)
    assert_one_line_error(code, err, "not closed", needle)
    assert digest(root / "README.md") == before


@pytest.mark.parametrize("count", [1, 40_000])
def test_an_unclosed_table_marker_in_a_results_file_is_one_line(tmp_path, count) -> None:
    root = results_root(tmp_path, extra="<!-- table: u -->\ny\n" * count)
    (root / "README.md").write_text(readme_text(TABLE), encoding="utf-8")
    code, _, err = tool(root / "README.md", "--check", timeout=60)
    assert_one_line_error(code, err, "r.md", "not closed")


def test_marked_blocks_finds_what_the_closed_markers_enclose() -> None:
    text = "a\n<!-- results: docs/results/r.md#t -->\n| 1 |\n<!-- /results -->\nb\n"
    text += "<!-- /results -->\n<!-- results: docs/results/s.md#u -->\n<!-- /results -->"
    blocks = marked_blocks(text, BLOCK_OPEN, BLOCK_CLOSE, "README")
    assert [(b.opening["path"], b.opening["table"], b.body) for b in blocks] == [
        ("docs/results/r.md", "t", "| 1 |\n"),
        ("docs/results/s.md", "u", ""),
    ]
    assert text[blocks[0].start : blocks[0].end] == "\n".join(text.splitlines()[1:4])
    assert text[blocks[1].end :] == ""
    lenient = marked_blocks(UNCLOSED + text, BLOCK_OPEN, BLOCK_CLOSE, "README", strict=False)
    assert [b.body for b in lenient] == ["| 1 |\n", ""]
    with pytest.raises(ResultsError, match="line 1"):
        marked_blocks(UNCLOSED + text, BLOCK_OPEN, BLOCK_CLOSE, "README")


@pytest.mark.parametrize(
    "marker", ["<!-- /results -->", "<!-- results: docs/results/r.md#t -->", "<!-- /results -->  "]
)
def test_a_results_table_holding_a_marker_line_is_refused_not_copied(tmp_path, marker) -> None:
    held = f"{TABLE}\n{marker}\n| y | 0.5 |"
    root = results_root(tmp_path, table=held)
    readme = root / "README.md"
    readme.write_text(readme_text(TABLE), encoding="utf-8")
    before = digest(readme)
    for args in ([], [], ["--check"]):  # each run the same: refused, the README as it was
        code, _, err = tool(readme, *args)
        assert_one_line_error(code, err, "marker line")
        assert digest(readme) == before


@pytest.mark.parametrize("link", ["absolute", "relative", "chain"])
def test_a_linked_readme_stays_a_link_and_its_target_is_rewritten(tmp_path, link) -> None:
    real = results_root(tmp_path / "real")
    target = real / "README.md"
    target.write_text(readme_text(TABLE.replace("0.125", "0.126")), encoding="utf-8")
    readme = tmp_path / "README.md"
    if link == "absolute":
        readme.symlink_to(target)
    elif link == "relative":
        readme.symlink_to(Path("real") / "README.md")
    else:
        (tmp_path / "hop.md").symlink_to(target)
        readme.symlink_to(tmp_path / "hop.md")
    code, _, err = tool(readme)
    assert code == 0, err
    assert readme.is_symlink() and readme.resolve() == target.resolve()
    assert target.read_text(encoding="utf-8") == readme_text(TABLE)
    assert tool(readme, "--check")[0] == 0


# ----- training -------------------------------------------------------------------------------
def train(out: Path, *sets: str, resume: bool = False) -> tuple[int, str]:
    """`python -m smelt_interp.train` on the tiny Dyck preset, the Baseline only."""
    args: list[Any] = ["--preset", "dyck-pair-tiny", "--arch", "baseline", "--out", out, "--quiet"]
    for item in ("threads=1", "eval_every=1000", "dyck_eval_n=4", "warmup_steps=1", *sets):
        args += ["--set", item]
    code, _, err = run_command("smelt_interp.train", *args, *(["--resume"] if resume else []))
    return code, err


def killed_log(steps: int, torn: bool = False) -> str:
    """What a run killed before its first save leaves: train records of steps 1..steps."""
    lines = [json.dumps({"event": "train", "step": s, "loss": 9.0}) for s in range(1, steps + 1)]
    return "\n".join(lines) + ("\n" + '{"event": "tr' if torn else "\n")


@pytest.mark.parametrize("earlier", [0, 1, 2])
@pytest.mark.parametrize("torn", [False, True])
def test_a_resume_without_a_state_starts_a_fresh_log_and_keeps_the_old(
    tmp_path: Path, earlier: int, torn: bool
) -> None:
    run = tmp_path / "baseline"
    run.mkdir()
    old = killed_log(3, torn)
    (run / "metrics.jsonl").write_text(old)
    asides = [run / f"metrics.jsonl.before-resume-{k}" for k in range(1, earlier + 2)]
    for k, path in enumerate(asides[:-1]):
        path.write_text(f"earlier {k}\n")
    code, err = train(tmp_path, "steps=2", "ckpt_every=2", resume=True)
    assert code == 0, err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "train"] == [1, 2]  # each step once
    assert asides[-1].read_text() == old  # set aside, not deleted
    for k, path in enumerate(asides[:-1]):
        assert path.read_text() == f"earlier {k}\n"


@pytest.mark.parametrize("kind", ["file", "link-to-file", "dangling-link"])
def test_keep_ckpts_until_with_early_not_a_folder_is_refused_before_training(
    tmp_path: Path, kind: str
) -> None:
    run = tmp_path / "baseline"
    run.mkdir()
    early = run / "early"
    if kind == "file":
        early.write_text("keep me")
    elif kind == "link-to-file":
        (tmp_path / "f").write_text("keep me")
        early.symlink_to(tmp_path / "f")
    else:
        early.symlink_to(tmp_path / "missing")
    code, err = train(tmp_path, "steps=4", "ckpt_every=2", "keep_ckpts_until=4")
    assert_one_line_error(code, err, "early", "keep_ckpts_until")
    assert sorted(p.name for p in run.iterdir()) == ["early"]  # nothing trained or written


@pytest.mark.parametrize("rows", [1025, 4096, 65536])
def test_eval_rows_past_the_cap_is_refused_up_front(tmp_path: Path, rows: int) -> None:
    with pytest.raises(ConfigError, match="eval_rows"):
        TrainConfig.from_dict(get_preset("dyck-pair-tiny") | {"eval_rows": rows})
    code, err = train(tmp_path, "steps=2", f"eval_rows={rows}")
    assert_one_line_error(code, err, "eval_rows")
    assert not (tmp_path / "baseline").exists()
    assert TrainConfig.from_dict(get_preset("dyck-pair-tiny") | {"eval_rows": 1024}).eval.rows
