"""This machine's limits, measured once: the RAM this process may use (physical memory or the
cgroup's limit, whichever is lower), the memory it can still get, and the units every message
about them uses (GIB, sizes and durations as text)."""

from __future__ import annotations

import os

GIB = 1 << 30
CGROUP_LIMIT_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def physical_memory() -> int:
    """Bytes of physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_limit_bytes() -> int:
    """The RAM this process may use: physical memory, or the cgroup's limit when lower."""
    limit = physical_memory()
    for path in CGROUP_LIMIT_FILES:
        try:
            with open(path, encoding="ascii") as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit():
            limit = min(limit, int(text))
    return limit


def available_memory() -> int:
    """Bytes of memory this process can still get: MemAvailable (else all physical memory),
    never more than the cgroup's limit."""
    free = physical_memory()
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    return min(free, memory_limit_bytes())


def size_text(n_bytes: float) -> str:
    """A memory size in GiB, MiB or KiB."""
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:,.1f} {unit}"
    return f"{n_bytes / 1024:,.1f} KiB"


def long_duration(seconds: float) -> str:
    """A duration in the largest unit that keeps it above 1: '3.2 hours', '41,000 years' (for
    what work too large to run would take)."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:,.0f} s"


def clock_duration(seconds: float) -> str:
    """'45 s', '3 min 20 s', '2 h 05 min' (for what a running job has taken or has left)."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
