"""Analyses over many runs or a pair of checkpoints: the scaling-law fit (scaling.py) and the
downstream comparison (downstream.py). Their command lines live in cli.py, so these modules stay
importable without argparse or the figures."""
