"""The probe commands end to end: a checkpoint in, a printed table with the paper's values,
valid CSV and JSON out; bad input gives one stderr line and exit code 2, leaving earlier
output files untouched. Runs on conftest's trained `tiny_pair`."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from smelt_interp.cli import run_cli
from smelt_interp.probes import routing, similarity, sink
from smelt_interp.probes.cli import probe_main

REPO = Path(__file__).resolve().parents[2]


def run_module(module: str, *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"smelt_interp.probes.{module}", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def in_process(spec, argv, capsys) -> tuple[int, str, str]:
    """`python -m smelt_interp.probes.<spec.name> argv...`, run in this process."""
    with pytest.raises(SystemExit) as exit_info:
        run_cli(functools.partial(probe_main, spec), [str(a) for a in argv])
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


def test_sink_command_compares_two_checkpoints(tiny_pair, tmp_path):
    csv, js = tmp_path / "sink.csv", tmp_path / "sink.json"
    res = run_module(
        "sink",
        tiny_pair["smelt"],
        "--compare",
        tiny_pair["baseline"],
        "--n-seqs",
        3,
        "--seq-len",
        40,
        "--csv",
        csv,
        "--json",
        js,
    )
    assert res.returncode == 0, res.stderr
    assert (
        "sink mass, loop span, visit 1" in res.stdout
        and "smelt" in res.stdout
        and "baseline" in res.stdout
    )
    heads = pd.read_csv(csv)
    assert list(heads.columns[:5]) == ["model", "layer", "visit", "depth", "head"]
    assert set(heads["model"]) == {"smelt", "baseline"}
    assert heads["sink_mass"].between(0, 1).all()
    assert heads[["sink_mass_64", "v_norm_ratio", "uniform_mass_64"]].notna().all().all()
    assert "Sink^0.3 (Gu et al.)" in res.stdout and "pooled Sink^0.3" in res.stdout
    assert "v_norm_ratio" in res.stdout
    visits = pd.read_csv(tmp_path / "sink.visits.csv")
    assert {"sink_mass", "share_sink_heads", "sink03_gu"} <= set(visits.columns)
    payload = json.loads(js.read_text())
    stats = {row["statistic"] for row in payload["summary"]}
    assert "Sink^0.3 (Gu et al.)" in stats
    assert payload["probe"] == "sink" and set(payload["models"]) == {"smelt", "baseline"}
    assert len(payload["tables"]["heads"]) == len(heads)
    assert {"statistic", "smelt", "baseline", "paper"} <= set(payload["summary"][0])


def test_routing_command_refuses_a_baseline_and_keeps_old_output(tiny_pair, tmp_path):
    csv = tmp_path / "keep.csv"
    csv.write_text("earlier results\n")
    res = run_module("routing", tiny_pair["baseline"], "--n-seqs", 2, "--seq-len", 16, "--csv", csv)
    assert res.returncode == 2
    assert res.stderr.startswith("error:") and len(res.stderr.strip().splitlines()) == 1
    assert "not looped" in res.stderr
    assert csv.read_text() == "earlier results\n"


@pytest.mark.parametrize(
    "case", ["missing", "corrupt", "seq_len", "data_path", "bad_flag", "bad_demos"]
)
def test_bad_input_is_one_line_exit_2(case, tiny_pair, tmp_path, capsys):
    ckpt = tiny_pair["smelt"]
    if case == "missing":
        argv = [tmp_path / "nope.pt"]
    elif case == "corrupt":
        bad = tmp_path / "corrupt.pt"
        bad.write_bytes(ckpt.read_bytes()[:200])
        argv = [bad]
    elif case == "seq_len":
        argv = [ckpt, "--seq-len", 100_000]
    elif case == "data_path":
        argv = [ckpt, "--data", tmp_path / "missing.txt"]
    elif case == "bad_flag":
        argv = [ckpt, "--n-seqs", "zero"]
    else:
        argv = [ckpt, "--demos", "1,x"]
    code, _, err = in_process(sink.PROBE, argv, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "error:" in err
    expected = {
        "missing": "nope.pt: no such checkpoint",
        "corrupt": "not a readable checkpoint",
        "seq_len": "exceeds the model's max_seq_len",
        "data_path": "no such file",
        "bad_flag": "--n-seqs",
        "bad_demos": "--demos",
    }[case]
    assert expected in err


def test_data_from_a_text_file(tiny_pair, tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("hello probes " * 40)
    code, out, _ = in_process(
        similarity.PROBE,
        [tiny_pair["baseline"], "--data", text, "--n-seqs", 2, "--seq-len", 32],
        capsys,
    )
    assert code == 0
    assert "control" in out and "0.28-0.34" in out  # paper's control beside ours


def test_routing_prints_paper_values(tiny_pair, tmp_path, capsys):
    code, out, _ = in_process(
        routing.PROBE,
        [
            tiny_pair["smelt"],
            "--data",
            "arith",
            "--n-seqs",
            2,
            "--seq-len",
            32,
            "--json",
            tmp_path / "r.json",
        ],
        capsys,
    )
    assert code == 0 and "2-3 of 8" in out and "chance" in out
    tables = json.loads((tmp_path / "r.json").read_text())["tables"]
    assert set(tables) == {"overlap", "usage"}


def test_closed_pipe_is_no_traceback(tiny_pair):
    """`python -m smelt_interp.probes.sink ... | head -1`: the reader leaves early, no traceback."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "smelt_interp.probes.sink",
            str(tiny_pair["smelt"]),
            "--n-seqs",
            "2",
            "--seq-len",
            "32",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.readline()
    proc.stdout.close()  # like `head -1` exiting
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err, err


def test_dyck_words_follow_the_checkpoints_training_spec(tiny_pair):
    """The probes' Dyck data is drawn like the run's held-out set: the dyck spec recorded in
    the checkpoint's train_config (dyck-pair-tiny: two bracket pairs, words up to 8)."""
    from smelt_interp.data.dyck import DyckSpec
    from smelt_interp.loading import load_models
    from smelt_interp.probes.cli import build_parser, request_from_args
    from smelt_interp.probes.session import make_inputs
    from smelt_interp.train.presets import get_preset

    args = build_parser("probe", "test").parse_args(
        [str(tiny_pair["smelt"]), "--n-seqs", "4", "--demos", "0,2"]
    )
    inputs = make_inputs(request_from_args(args), *load_models([args.checkpoint], "cpu"))
    assert inputs.dyck == DyckSpec(**get_preset("dyck-pair-tiny")["dyck"])
    words = [(ex.query + " " + ex.answer).split() for ex in inputs.dyck_examples()]
    assert max(map(len, words)) <= inputs.dyck.max_len
    assert {b for word in words for b in word} <= set("()[]")


def test_dyck_prompts_come_from_the_draw_asked_for(tiny_pair):
    """`--draw validation` gives the held-out prompts every probe drew before the draws were
    named (make_dataset, split 'heldout'); the default, the test draw, shares no word with
    them, for each demonstration count."""
    import dataclasses

    from smelt_interp.data.dyck import dyck_max_len, make_dataset
    from smelt_interp.loading import load_models
    from smelt_interp.probes.cli import build_parser, request_from_args
    from smelt_interp.probes.session import make_inputs

    def prompts(*flags: str):
        argv = [str(tiny_pair["smelt"]), "--n-seqs", "6", "--demos", "0,2", "--seed", "3"]
        args = build_parser("probe", "test").parse_args([*argv, *flags])
        inputs = make_inputs(request_from_args(args), *load_models([args.checkpoint], "cpu"))
        by_count = {k: [ex for ex in inputs.dyck_examples() if ex.n_demos == k] for k in (0, 2)}
        return inputs, by_count

    inputs, validation = prompts("--draw", "validation")
    for k, examples in validation.items():
        spec = dataclasses.replace(inputs.dyck, max_len=dyck_max_len(inputs.max_seq_len, k, 8))
        assert examples == make_dataset(6, spec=spec, n_demos=k, seed=3 + 1000 * k, split="heldout")
    _, test = prompts()
    for k in (0, 2):
        words = {w for ex in test[k] for w in (ex.query, *(p for p, _ in ex.demos))}
        shown = {w for ex in validation[k] for w in (ex.query, *(p for p, _ in ex.demos))}
        assert len(test[k]) == 6 and not words & shown


def test_each_task_reads_the_spec_of_a_model_trained_on_it(make_cfg, make_model):
    """A recall model served first does not set the Dyck pair's words, nor a Dyck model the
    recall rows: each task's spec comes from the first checkpoint trained on it."""
    from smelt_interp.checkpoint import CheckpointInfo
    from smelt_interp.data.assoc_recall import AssocRecallSpec
    from smelt_interp.data.dyck import DyckSpec
    from smelt_interp.probes.inputs import ProbeRequest
    from smelt_interp.probes.session import make_inputs

    recall_cfg = {"data": {"assoc_recall": 1.0}, "assoc_recall": {"n_triggers": 2}}
    dyck_cfg = {"data": {"dyck": 1.0}, "dyck": {"p_open": 0.6, "max_depth": 9}}
    models = {n: make_model(make_cfg(max_seq_len=64)) for n in ("recall", "dyck")}
    infos = {
        "recall": CheckpointInfo(Path("recall.pt"), train_config=recall_cfg),
        "dyck": CheckpointInfo(Path("dyck.pt"), train_config=dyck_cfg),
    }
    inputs = make_inputs(ProbeRequest(), models, infos)
    assert inputs.dyck == DyckSpec(p_open=0.6, max_depth=9)
    assert inputs.assoc_recall == AssocRecallSpec(n_triggers=2)
    assert inputs.trained_task == "assoc_recall"  # the default task stays the first model's
    alone = make_inputs(ProbeRequest(), {"recall": models["recall"]}, {"recall": infos["recall"]})
    assert alone.dyck == DyckSpec()  # no Dyck model: the first checkpoint's (the default)
