"""Loops at inference on a dense model: a span of its own layers run again, untrained.

`Loop(start, end, repeats)` is the half-open span START:END run `repeats` times, written
`START:END` or `START:ENDxR` (R defaults to 2), as `--loop` and a served model's `FOLDER@SPAN`
name it. Its schedule is SmeltModel's: layers 0..start-1 once, start..end-1 `repeats` times as a
block (visit v of every layer in the span in the v-th pass), then end..n-1 once. The same layer
modules run again (`ScheduledLayers`), with nothing rescaled: unlike SmeltModel's trained loop,
whose writes carry the 1/r scale it was trained with, an inference loop adds each visit's write
in full, so with R = 1 it would be the model as it is (no 1/r: the untrained weights never saw
one, and a scaled write would change every visit, not only the repeats)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from smelt_interp.config import Schedule
from smelt_interp.errors import CheckpointError

SPAN = re.compile(r"^(\d+):(\d+)(?:x(\d+))?$")
SEPARATOR = "@"  # FOLDER@12:18x2 names a folder looped at inference


@dataclass(frozen=True)
class Loop:
    """The half-open span start:end of layers, run `repeats` times in a row."""

    start: int
    end: int
    repeats: int = 2

    @property
    def text(self) -> str:
        """As the command line writes it: '12:18x2'."""
        return f"{self.start}:{self.end}x{self.repeats}"

    def check(self, n_layers: int) -> None:
        """A ValueError line unless the span lies in 0..n_layers, is not empty, repeats >= 2."""
        if self.end <= self.start:
            raise ValueError(f"loop {self.text}: the span {self.start}:{self.end} is empty")
        if self.end > n_layers:
            raise ValueError(
                f"loop {self.text}: the span ends past the model's {n_layers} layers "
                f"(layers are 0..{n_layers - 1}; the end is exclusive, at most {n_layers})"
            )
        if self.repeats < 2:
            raise ValueError(f"loop {self.text}: a loop runs its span at least twice (xR, R >= 2)")

    def schedule(self, n_layers: int) -> Schedule:
        """(layer, visit) in execution order, as SmeltModel's config builds it."""
        self.check(n_layers)
        order = [(layer, 0) for layer in range(self.start)]
        for visit in range(self.repeats):
            order += [(layer, visit) for layer in range(self.start, self.end)]
        return tuple(order + [(layer, 0) for layer in range(self.end, n_layers)])


def parse_loop(text: str) -> Loop:
    """'12:18' or '12:18x3' as a Loop; a ValueError line otherwise (the span is checked against
    a model only when it is loaded)."""
    match = SPAN.match(text.strip())
    if match is None:
        raise ValueError(f"loop {text!r}: expected START:END or START:ENDxR, e.g. 12:18x2")
    start, end, repeats = match.groups()
    return Loop(int(start), int(end), int(repeats) if repeats is not None else 2)


def split_loop_name(path: str | Path) -> tuple[Path, Loop | None]:
    """'models/x@12:18x2' -> (models/x, Loop(12, 18, 2)); a path without a loop suffix, or one
    that names an existing file or folder as it is, comes back unchanged."""
    text = str(path)
    base, sep, span = text.rpartition(SEPARATOR)
    if not sep or Path(text).exists() or SPAN.match(span) is None:
        return Path(text), None
    return Path(base), parse_loop(span)


def loop_label(name: str, loop: Loop | None) -> str:
    """A model's name with its inference loop, as it is served: 'smollm2-135m@12:18x2'."""
    return name if loop is None else f"{name}{SEPARATOR}{loop.text}"


class ScheduledLayers(nn.ModuleList):
    """A decoder's layer list that its model's forward walks in schedule order: slicing it (as
    the Llama-family forward does, `layers[:num_hidden_layers]`) gives the layers of `order`,
    each module as often as it runs; indexing, iterating and the state dict see each layer once
    (the parameters are not copied)."""

    def __init__(self, layers: list[nn.Module], order: tuple[int, ...]) -> None:
        super().__init__(layers)
        self.order = order

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            if (
                index.start in (None, 0)
                and index.step in (None, 1)
                and (index.stop is None or index.stop >= len(self))
            ):
                return [self[i] for i in self.order]
            raise IndexError("a looped layer list is walked whole, in schedule order")
        return super().__getitem__(index)


def apply_loop(arch: Any, hf: nn.Module, n_layers: int, loop: Loop, where: str) -> Schedule:
    """Set hf to run `loop` (arch.set_schedule) and return the schedule; a CheckpointError line
    for a model that loops already (its own schedule) or a span the model does not hold."""
    if getattr(arch, "loops", True):
        raise CheckpointError(
            f"{where}: a {arch.model_types[0]} model loops already by its own config; "
            f"--loop {loop.text} is for dense models ({', '.join(DENSE_TYPES)})"
        )
    try:
        schedule = loop.schedule(n_layers)
    except ValueError as exc:
        raise CheckpointError(f"{where}: {exc}") from None
    arch.set_schedule(hf, schedule)
    return schedule


DENSE_TYPES = ("llama", "mistral")  # dense.Dense.model_types, for messages
