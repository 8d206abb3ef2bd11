"""A small thread-safe LRU cache in which threads asking for one key share one computation: the
dashboard's model runs and probe tables, where 32 users asking for the same (model, layer, rows)
must not each run the model."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

CACHE_SIZE = 64  # entries kept by default: a few MiB each at the served lengths


class LRU:
    """get_or_compute(key, fn): the cached value, or fn() stored under key. Threads asking for
    one key share one computation (the others wait for it); different keys compute in parallel
    and a hit never waits for another key's work. Counts hits and misses."""

    def __init__(self, maxsize: int = CACHE_SIZE) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()  # guards _data, _pending and the counts, never held long
        self._pending: dict[Hashable, threading.Event] = {}  # keys being computed
        self.hits = 0
        self.misses = 0

    def get_or_compute(self, key: Hashable, fn: Callable[[], Any]) -> Any:
        while True:
            with self._lock:
                if key in self._data:
                    self._data.move_to_end(key)
                    self.hits += 1
                    return self._data[key]
                done = self._pending.get(key)
                if done is None:
                    done = self._pending[key] = threading.Event()
                    self.misses += 1
                    break
            done.wait()  # another thread computes this key; then look again
        try:
            value = fn()
            with self._lock:
                self._data[key] = value
                while len(self._data) > self.maxsize:
                    self._data.popitem(last=False)
            return value
        finally:
            with self._lock:
                del self._pending[key]
            done.set()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)
