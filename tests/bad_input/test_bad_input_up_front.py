"""Work that cannot be done is refused before any is: `train eval` counts that cannot fit in
memory name the memory they need, and a pair whose SMELT cannot be budget-matched is refused
before its Baseline trains. Commands run in-process through `runpy`."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from helpers.bad_input import assert_one_line_error, run_command

from smelt_interp.train import __main__ as train_cli

TRAIN = "smelt_interp.train"


@pytest.mark.parametrize(
    "flags",
    [
        ["--n", "1000000000"],
        ["--n", str(10**15)],
        ["--loss-rows", "1000000000"],
        ["--per-depth", "1000000000"],
        ["--per-depth", "50000000", "--n", "10"],
    ],
)
def test_train_eval_counts_beyond_memory_are_refused_with_the_size(
    tiny_pair: dict[str, Path], tmp_path: Path, flags: list[str]
) -> None:
    out = tmp_path / "r.json"
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, stdout, err = run_command(TRAIN, "eval", tiny_pair["smelt"], *flags, "--json", out)
    assert_one_line_error(code, err, "GiB", flags[0])
    assert stdout == "" and not out.exists()
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mib < 300, f"memory grew {grown_mib:.0f} MiB before the refusal"


def test_the_eval_estimate_grows_with_every_count(tiny_pair: dict[str, Path]) -> None:
    def need(**flags: int | None) -> int:
        args = {"n": 1000, "loss_rows": 64, "per_depth": None, **flags}
        return train_cli.eval_bytes(str(tiny_pair["smelt"]), type("Args", (), args))

    assert need(n=2000) > need() and need(loss_rows=128) > need()
    assert need(per_depth=1000) > need(per_depth=10)
    assert need() < 2**30  # the defaults fit anywhere


@pytest.mark.parametrize(
    "sets",
    [
        ["model.n_layers=1"],  # no loop span
        ["model.d_model=8", "model.d_head=8", "model.n_heads=1", "model.n_kv_heads=1"],
        ["model.d_expert=4"],  # the closest SMELT misses the tolerances
    ],
)
def test_a_pair_whose_smelt_cannot_be_matched_trains_nothing(tmp_path: Path, sets: list[str]):
    args = ["--preset", "dyck-pair-tiny", "--out", tmp_path / "pair", "--quiet"]
    for item in ["threads=1", "steps=2", *sets]:
        args += ["--set", item]
    code, _, err = run_command(TRAIN, *args)
    assert_one_line_error(code, err, "smelt")
    assert not (tmp_path / "pair" / "baseline").exists()  # refused before the Baseline trained
