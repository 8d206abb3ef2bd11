"""Benchmarks of smelt-interp: `python -m benchmarks` runs every `*_bench.py` module here."""
