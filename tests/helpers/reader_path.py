"""The path a reader follows from a request down to its arithmetic, and how often it climbs back
up a layer (the rows of pyproject.toml's import-linter layers, top first).

Followed with a profiler: at every call into a function of measure/ (where the numbers are
computed), the project's frames on the call stack join the path, each the first time it is met,
in the order met: the functions a reader opens, going to definitions, to get from the request
to every piece of arithmetic it asks for. The path's layers, consecutive frames of one layer
merged, climb where a frame sits in a higher layer than the one before it: a lower layer calling
back up (a forward hook into measure/), or a caller that carries the number on after a lower
layer's arithmetic returned (a probe dividing measure's sums, a page pooling a probe's table)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _ranks() -> dict[str, int]:
    """{package or module under smelt_interp: its row in pyproject.toml's layers, top first}."""
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    rows = next(c["layers"] for c in contracts if c["type"] == "layers")
    return {
        name.removeprefix("smelt_interp."): rank
        for rank, row in enumerate(rows)
        for name in row.split(" | ")
    }


RANK = _ranks()
ARITHMETIC = "measure"


@dataclass(frozen=True)
class Stop:
    """A run of consecutive path frames in one layer: its rank and its first function."""

    rank: int
    where: str


def _frames(frame: Any) -> list[tuple[int, str]] | None:
    """(rank, "package.module:function") of the project's frames on the stack, outermost first
    (comprehensions and other <...> code objects left out: they belong to their function);
    None while a module is being imported (its top level is not the request's path)."""
    found = []
    while frame is not None:
        parts = frame.f_globals.get("__name__", "").split(".")
        name = frame.f_code.co_name
        if name == "<module>" and parts[0] == "smelt_interp":
            return None
        if parts[0] == "smelt_interp" and len(parts) > 1 and parts[1] in RANK:
            if not name.startswith("<"):
                found.append((RANK[parts[1]], f"{'.'.join(parts[1:])}:{name}"))
        frame = frame.f_back
    return found[::-1]


def reader_path(run: Callable[[], Any]) -> list[Stop]:
    """The path of `run()` as stops, consecutive frames of one layer merged."""
    order: dict[tuple[int, str], int] = {}

    def profile(frame: Any, event: str, arg: Any) -> None:
        parts = frame.f_globals.get("__name__", "").split(".")
        if event == "call" and parts[:2] == ["smelt_interp", ARITHMETIC]:
            for found in _frames(frame) or ():
                order.setdefault(found, len(order))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    stops: list[Stop] = []
    for rank, where in sorted(order, key=order.__getitem__):
        if not stops or stops[-1].rank != rank:
            stops.append(Stop(rank, where))
    return stops


def climbs(stops: list[Stop]) -> list[tuple[Stop, Stop]]:
    """The (from, to) stops where the path goes back up a layer."""
    return [(a, b) for a, b in zip(stops, stops[1:]) if b.rank < a.rank]
