"""`python -m smelt_interp.probes NAME ckpt.pt`: any probe of the registry runs by name, a probe
of an installed package (an entry point of group `smelt_interp.probes`) or of an importable
module (`module:ATTR`) too, and `python -m smelt_interp.probes.sink` is the same command without
loading the probe module twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import TINY_FIELDS
from helpers.bad_input import assert_one_line_error, run_command

from smelt_interp.checkpoint import save_checkpoint
from smelt_interp.config import ModelConfig
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes import registry
from smelt_interp.probes.registry import ProbeSpec, summary

SMALL = ("--n-seqs", "2", "--seq-len", "32", "--data", "dyck")


def run_lengths(model, inputs, options) -> dict[str, pd.DataFrame]:
    """A probe from outside the package: each probed row's valid length."""
    _, lengths = inputs.batch()
    return {"rows": pd.DataFrame({"row": range(len(lengths)), "length": lengths.tolist()})}


PROBE = ProbeSpec(
    name="row_lengths",
    description="Valid tokens per probed row.",
    run=run_lengths,
    summarize=lambda t: summary([("mean length", float(t["rows"]["length"].mean()), "")]),
    tables=("rows",),
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = SmeltModel(ModelConfig.smelt(**TINY_FIELDS))
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt.pt", model, step=0)


def write_plugin(folder: Path, value: str) -> Path:
    """An installed distribution (its .dist-info only) whose entry point names `value`."""
    info = folder / "probe_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: probe-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[smelt_interp.probes]\nrow_lengths = {value}\n")
    return folder


@pytest.fixture
def plugin_path(tmp_path: Path):
    """This module's PROBE installed as a plugin for the length of one test."""
    folder = str(write_plugin(tmp_path / "site", f"{__name__}:PROBE"))
    sys.path.insert(0, folder)
    try:
        registry.load_plugins()
        yield folder
    finally:
        sys.path.remove(folder)
        registry.load_plugins()


def test_a_probe_runs_by_name_as_it_runs_as_a_module(ckpt: Path, tmp_path: Path):
    outputs = {}
    for label, command in (
        ("module", ("smelt_interp.probes.sink", ckpt)),
        ("name", ("smelt_interp.probes", "sink", ckpt)),
    ):
        outputs[label] = tmp_path / f"{label}.json"
        code, out, err = run_command(*command, *SMALL, "--json", outputs[label])
        assert code == 0, err
        assert "== sink: smelt ==" in out
    assert json.loads(outputs["module"].read_text()) == json.loads(outputs["name"].read_text())


def test_an_installed_plugin_probe_is_registered_and_runs_by_name(
    ckpt: Path, tmp_path: Path, plugin_path: str
):
    assert registry.get("row_lengths") is PROBE
    assert [s.name for s in registry.registered()][-1] == "row_lengths"
    out = tmp_path / "plugin.json"
    code, _, err = run_command("smelt_interp.probes", "row_lengths", ckpt, *SMALL, "--json", out)
    assert code == 0, err
    rows = json.loads(out.read_text())["tables"]["rows"]
    assert [r["length"] for r in rows] == [32, 32]  # two packed Dyck rows, no padding


def test_a_probe_of_an_importable_module_runs_by_module_and_attribute(ckpt: Path, tmp_path: Path):
    out = tmp_path / "module.json"
    code, _, err = run_command(
        "smelt_interp.probes", f"{__name__}:PROBE", ckpt, *SMALL, "--json", out
    )
    assert code == 0, err
    assert json.loads(out.read_text())["probe"] == "row_lengths"


@pytest.mark.parametrize(
    "name, needle",
    [
        ("nope", "unknown probe 'nope'"),
        ("no_such_module:PROBE", "cannot import"),
        (f"{__name__}:MISSING", "has no 'MISSING'"),
        ("json:dumps", "not a ProbeSpec"),
    ],
)
def test_a_probe_name_that_resolves_to_nothing_is_one_line(ckpt: Path, name: str, needle: str):
    code, _, err = run_command("smelt_interp.probes", name, ckpt)
    assert_one_line_error(code, err, needle)


@pytest.mark.parametrize("value", ["no_such_module:PROBE", "json:dumps"])
def test_a_broken_plugin_is_one_line(ckpt: Path, tmp_path: Path, value: str):
    folder = str(write_plugin(tmp_path / "site", value))
    sys.path.insert(0, folder)
    try:
        code, _, err = run_command("smelt_interp.probes", "sink", ckpt, *SMALL)
    finally:
        sys.path.remove(folder)
        registry.load_plugins()
    assert_one_line_error(code, err, "probe plugin", value)


def test_python_m_runs_a_plugin_and_a_probe_module_without_loading_it_twice(
    ckpt: Path, tmp_path: Path
):
    site = write_plugin(tmp_path / "site", f"{Path(__file__).stem}:PROBE")
    root = Path(__file__).resolve().parents[2]
    here = str(Path(__file__).resolve().parent)
    paths = [str(site), here, str(root / "tests"), str(root), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}

    def python_m(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", *args, str(ckpt), *SMALL]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)

    plugin = python_m("smelt_interp.probes", "row_lengths")
    assert plugin.returncode == 0, plugin.stderr[-2000:]
    assert "mean length" in plugin.stdout
    # sitecustomize runs in the child before the command: at exit it says whether a second
    # copy of the probe module was imported beside the one `python -m` ran as __main__
    (site / "sitecustomize.py").write_text(
        "import atexit, sys\n"
        "atexit.register(lambda: print('second copy:', 'smelt_interp.probes.sink' in sys.modules, "
        "sys.modules['__main__'].PROBE.name, file=sys.stderr))\n"
    )
    module = python_m("smelt_interp.probes.sink")
    assert module.returncode == 0, module.stderr[-2000:]
    assert "== sink: smelt ==" in module.stdout
    assert "second copy: False sink" in module.stderr  # the guard ran its own PROBE, once
