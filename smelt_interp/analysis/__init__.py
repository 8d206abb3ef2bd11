"""Analyses over many runs or a pair of checkpoints: the scaling-law fit (the `scaling` package)
and the downstream comparison (the `downstream` package). Their command lines live in
smelt_interp.commands, above the figures, so these modules import neither argparse nor the
figures; each package's `__main__` starts its command by name."""
