"""Analyses over many runs or a pair of checkpoints: the scaling-law fit (the `scaling` package)
and the downstream comparison (the `downstream` package). Each package's `__main__` is its
command line, so the computation modules stay importable without argparse or the figures."""
