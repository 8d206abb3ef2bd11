"""The console scripts that `pip install` puts on PATH ([project.scripts] in pyproject.toml),
each the same command as its `python -m` form. Each imports only its own command module, when
called, so a script loads no more than `python -m` would."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import NoReturn

from smelt_interp.cli import run_cli

# script name -> (command module, its main function), as [project.scripts] names them
COMMANDS: dict[str, tuple[str, str]] = {
    "smelt-train": ("smelt_interp.train.__main__", "main"),
    "smelt-app": ("smelt_interp.app.__main__", "main"),
    "smelt-report": ("smelt_interp.report", "main"),
    "smelt-budget": ("smelt_interp.budget.__main__", "main"),
    "smelt-probe": ("smelt_interp.probes.__main__", "main"),
    "smelt-scaling": ("smelt_interp.commands.scaling", "scaling_main"),
    "smelt-downstream": ("smelt_interp.commands.downstream", "downstream_main"),
    "smelt-seeds": ("smelt_interp.commands.seeds", "seeds_main"),
    "smelt-prepare": ("smelt_interp.data.__main__", "main"),
}


def run(script: str) -> NoReturn:
    """Run the command of `script` on sys.argv, errors as one line and exit code 2."""
    module, function = COMMANDS[script]
    run_cli(getattr(importlib.import_module(module), function))


def script(name: str) -> Callable[[], NoReturn]:
    """The entry point [project.scripts] names for the console script `name`."""
    return functools.partial(run, name)


train = script("smelt-train")
app = script("smelt-app")
report = script("smelt-report")
budget = script("smelt-budget")
probe = script("smelt-probe")
scaling = script("smelt-scaling")
downstream = script("smelt-downstream")
seeds = script("smelt-seeds")
prepare = script("smelt-prepare")
