"""Finished callback answers (figures, messages, info lines), kept per (view, served models,
inputs), so that users asking for the same view of the same models on the same inputs share one
drawing instead of each building it.

Drawing a plotly figure costs far more than the model work behind it once the forward pass or
probe table is cached (validation of every property, subplots, shapes), and with many users on
a few cores that drawing is what requests queue for. An answer depends only on its inputs and
the models it reads, so its key holds the inputs and every served model's version
(ModelRegistry.version): a checkpoint reloaded while the app runs is drawn afresh. Views that
read a file a run may still be writing add that file's stamp to their inputs (`file_stamp`).
Concurrent identical requests share one build (lru.LRU single-flight); the cache is bounded.
Figures are kept as plain dicts, which is what Dash sends, so a hit costs no plotly work."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from smelt_interp.app.lru import CACHE_SIZE, LRU
from smelt_interp.app.registry import ModelRegistry, stamp_of

FIGURE_CACHE_SIZE = CACHE_SIZE  # answers kept per page, as many as forward passes (lru.CACHE_SIZE)


def plain(value: Any) -> Any:
    """`value` with every plotly figure in it (at any depth of tuples and lists) as the dict
    Dash would send for it."""
    if isinstance(value, go.Figure):
        return value.to_plotly_json()
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def file_stamp(path: Path | None) -> tuple[int, int, int] | None:
    """A cache-key part that changes whenever the file at `path` is rewritten or grows."""
    return None if path is None else stamp_of(path)


class FigureCache:
    """answer(view, inputs, build): build()'s answer for `view` on `inputs` and the served
    models as they are now, built once and then shared. Counts builds (`lru.misses`)."""

    def __init__(self, registry: ModelRegistry, maxsize: int = FIGURE_CACHE_SIZE) -> None:
        self.registry = registry
        self.lru = LRU(maxsize)

    def served(self) -> tuple[tuple[str, int], ...]:
        """(name, version) of every served model: the part of a key that a reload changes."""
        return tuple((name, self.registry.version(name)) for name in self.registry.names)

    def answer(self, view: str, inputs: Sequence[Any], build: Callable[[], Any]) -> Any:
        # inputs are a callback's JSON values; their JSON text is a hashable key
        key = (view, self.served(), json.dumps(list(inputs), sort_keys=True, default=repr))
        return self.lru.get_or_compute(key, lambda: plain(build()))
