"""Benchmarks of smelt-interp: `python -m benchmarks` runs every `*_bench.py` module here."""

# Imported first, before torch, so that its OpenMP wait policy (PASSIVE unless set) applies here.
import smelt_interp  # noqa: F401
