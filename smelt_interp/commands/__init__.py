"""Command lines that sit above the figures: the scaling fit (`scaling`) and the downstream
comparison (`downstream`), which `python -m smelt_interp.analysis.scaling` and `.downstream`
start, and the console scripts of pyproject.toml (`scripts`)."""
