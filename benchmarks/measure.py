"""Timing and memory helpers shared by the benchmark scripts."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def interleaved_medians(
    fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1
) -> dict[str, float]:
    """Median seconds per call of each function, timed in interleaved rounds (A B A B ...)
    so that drift in machine load hits every contender alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _proc_status(field: str) -> int | None:
    """A /proc/self/status memory field in bytes (Linux), else None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_extra_rss(fn: Callable[[], object]) -> int | None:
    """Peak resident memory a call adds above the resident memory before it (Linux: reset the
    high-water mark through /proc/self/clear_refs, then read VmHWM). None where unsupported."""
    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    before = _proc_status("VmRSS")
    fn()
    peak = _proc_status("VmHWM")
    return None if before is None or peak is None else max(peak - before, 0)


def mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f} MiB"


# ----- 1. hook-point overhead --------------------------------------------------------------
