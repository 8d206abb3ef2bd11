"""The console scripts of pyproject.toml ([project.scripts]) each name a command that exists,
and a script runs the same command as its `python -m` form."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import tomllib
from helpers.bad_input import run_command

from smelt_interp.commands import scripts

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
LADDER_CSV = ROOT / "docs" / "results" / "cpu_ladder_runs.csv"


def test_every_script_names_a_command():
    assert set(SCRIPTS) == set(scripts.COMMANDS)
    for name, target in SCRIPTS.items():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), name
        command, function = scripts.COMMANDS[name]
        assert callable(getattr(importlib.import_module(command), function)), name


def test_a_script_runs_what_python_m_runs(monkeypatch, capsys):
    args = [str(LADDER_CSV), "--bootstrap", "0"]
    monkeypatch.setattr(sys, "argv", ["smelt-scaling", *args])
    with pytest.raises(SystemExit) as info:
        scripts.scaling()
    assert info.value.code == 0
    by_script = capsys.readouterr().out
    code, by_module, err = run_command("smelt_interp.analysis.scaling", *args)
    assert code == 0, err
    assert by_script == by_module and "compute savings of smelt over baseline" in by_script
