"""What `python -m smelt_interp.train` trains: `--arch` when given, else a config's own `arch`,
else the pair; a config's `arch` and a different `--arch` are one line, exit 2."""

from __future__ import annotations

import json

import pytest

from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.cli import run_cli
from smelt_interp.errors import ConfigError, MatchError
from smelt_interp.train.__main__ import archs_to_train, main
from smelt_interp.train.build import config_from, config_layers

# A Guo-style one-layer model: no loop span to repeat, so no SMELT model matches it.
ONE_LAYER = {
    "model": {
        "d_model": 16,
        "n_layers": 1,
        "n_heads": 1,
        "n_kv_heads": 1,
        "d_head": 16,
        "n_experts": 1,
        "top_k": 1,
        "d_expert": 32,
        "max_seq_len": 32,
    },
    "data": {"trigger": 1.0},
    "trigger": {"kinds": ["backcopy"]},
    "seq_len": 32,
    "batch_size": 2,
    "steps": 2,
    "warmup_steps": 0,
    "eval_every": 2,
    "eval_rows": 2,
    "ckpt_every": 2,
    "dyck_eval_n": 0,
    "threads": 1,
}


@pytest.mark.parametrize(
    "cli, named, archs",
    [
        (None, None, ("baseline", "smelt")),
        ("pair", None, ("baseline", "smelt")),
        ("smelt", None, ("smelt",)),
        (None, "baseline", ("baseline",)),
        (None, "smelt", ("smelt",)),
        ("baseline", "baseline", ("baseline",)),
    ],
)
def test_arch_comes_from_the_command_line_then_the_config_then_the_pair(cli, named, archs):
    assert archs_to_train(cli, named) == archs


@pytest.mark.parametrize("cli, named", [("pair", "baseline"), ("smelt", "baseline")])
def test_a_config_arch_that_the_command_line_contradicts_is_refused(cli, named):
    with pytest.raises(ConfigError, match=f"--arch {cli} conflicts with the config's arch"):
        archs_to_train(cli, named)


def write_config(tmp_path, **fields):
    path = tmp_path / "guo.json"
    path.write_text(json.dumps({**ONE_LAYER, **fields}))
    return str(path)


def test_a_config_file_arch_baseline_trains_a_one_layer_baseline(tmp_path):
    out = tmp_path / "run"
    config = write_config(tmp_path, arch="baseline")
    assert main(["--config", config, "--out", str(out), "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["baseline"]  # no SMELT model trained
    model, info = load_checkpoint(out / "baseline" / "ckpt.pt")
    assert model.cfg.n_layers == 1 and info.step == 2


def test_a_pair_of_one_layer_is_refused_before_anything_trains(tmp_path):
    out = tmp_path / "run"
    config = write_config(tmp_path)  # no arch: the pair
    with pytest.raises(MatchError, match="no loop span"):
        main(["--config", config, "--out", str(out), "--quiet"])
    assert not (out / "baseline").exists()


def test_a_conflict_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "run"
    config = write_config(tmp_path, arch="baseline")
    with pytest.raises(SystemExit) as stop:
        run_cli(main, ["--config", config, "--arch", "pair", "--out", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --arch pair conflicts")
    assert not out.exists()


def test_the_sink_control_preset_names_a_baseline_and_builds():
    data, user = config_layers("sink-control", None, [])
    cfg = config_from(data, user)
    assert archs_to_train(None, data.get("arch")) == ("baseline",)
    assert cfg.model.n_layers == 1 and cfg.model.positions == "learned"
