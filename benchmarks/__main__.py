"""Run every benchmark script in this folder (each `*_bench.py` module's `main(argv)`), passing
the command-line flags through, e.g. `python -m benchmarks --quick`. A script whose parser
rejects a flag is reported and skipped; the others still run."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    modules = sorted(p.stem for p in Path(__file__).parent.glob("*_bench.py"))
    status = 0
    for name in modules:
        print(f"== benchmarks.{name}", flush=True)
        start = time.perf_counter()
        try:
            status |= importlib.import_module(f"benchmarks.{name}").main(argv) or 0
        except SystemExit as exc:  # argparse: a flag this script does not take
            if exc.code not in (0, None):
                print(
                    f"== benchmarks.{name} skipped: it exits {exc.code} on flags {argv}", flush=True
                )
                status |= 1
            continue
        print(f"== benchmarks.{name} done in {time.perf_counter() - start:.0f} s\n", flush=True)
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
