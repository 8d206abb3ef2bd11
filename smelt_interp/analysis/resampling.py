"""The largest bootstrap the analyses run, and what a larger one would cost: a request beyond
MAX_RESAMPLES is refused before any work, with the time and memory it would need."""

from __future__ import annotations

from smelt_interp.errors import ConfigError
from smelt_interp.machine import long_duration, size_text

MAX_RESAMPLES = 100_000


def check_resamples(n: int, seconds_each: float, bytes_each: int, what: str) -> None:
    """Refuse `n` resamples beyond MAX_RESAMPLES (ConfigError naming `what`, e.g. the flag),
    giving the time and memory they would take at `seconds_each` and `bytes_each`."""
    if n <= MAX_RESAMPLES:
        return
    raise ConfigError(
        f"{what} {n:,} would take about {long_duration(n * seconds_each)} "
        f"({seconds_each:g} s each) and {size_text(n * bytes_each)}; "
        f"use at most {MAX_RESAMPLES:,}"
    )
