"""The largest bootstrap the analyses run, and what a larger one would cost: a request beyond
MAX_RESAMPLES is refused before any work, with the time and memory it would need."""

from __future__ import annotations

from smelt_interp.errors import ConfigError

MAX_RESAMPLES = 100_000


def duration(seconds: float) -> str:
    """A duration in the largest unit that keeps it above 1: '3.2 hours', '41,000 years'."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:,.0f} s"


def size(n_bytes: float) -> str:
    """A memory size in GiB, MiB or KiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:,.1f} {unit}"
    return f"{n_bytes / 1024:,.1f} KiB"


def check_resamples(n: int, seconds_each: float, bytes_each: int, what: str) -> None:
    """Refuse `n` resamples beyond MAX_RESAMPLES (ConfigError naming `what`, e.g. the flag),
    giving the time and memory they would take at `seconds_each` and `bytes_each`."""
    if n <= MAX_RESAMPLES:
        return
    raise ConfigError(
        f"{what} {n:,} would take about {duration(n * seconds_each)} "
        f"({seconds_each:g} s each) and {size(n * bytes_each)}; "
        f"use at most {MAX_RESAMPLES:,}"
    )
