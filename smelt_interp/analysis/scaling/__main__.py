"""`python -m smelt_interp.analysis.scaling ...` is `python -m smelt_interp.commands.scaling ...`:
the command lives at the top of the import graph (it draws with the figures), so this package
starts it by name instead of importing it."""

import runpy

if __name__ == "__main__":
    runpy.run_module("smelt_interp.commands.scaling", run_name="__main__", alter_sys=True)
