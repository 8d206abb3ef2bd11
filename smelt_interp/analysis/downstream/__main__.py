"""`python -m smelt_interp.analysis.downstream ...` runs the command
smelt_interp.commands.downstream (it draws with the figures). This module is an entry point that
nothing imports, so it may sit above every row: the layers contract names this one import as an
exception (pyproject.toml)."""

from smelt_interp.cli import run_cli
from smelt_interp.commands.downstream import downstream_main

if __name__ == "__main__":
    run_cli(downstream_main)
