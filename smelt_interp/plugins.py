"""Extensions that installed packages declare as entry points (`[project.entry-points.GROUP]`
with `name = "package.module:OBJECT"`): loaded and checked in one place, so that a broken or
foreign plugin is one line naming it, never a traceback or a silent skip."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any


def installed(group: str, kind: type, what: str, error: type[Exception]) -> list[tuple[str, Any]]:
    """(entry point value, object) of every entry point of `group`, each loaded and checked to
    be a `kind`; one that does not load, or names something else, raises `error` naming it
    (`what`: the plugin's kind in words, e.g. "probe plugin")."""
    found = []
    for point in entry_points(group=group):
        try:
            obj = point.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the package down unnamed
            raise error(f"{what} {point.value!r} does not load: {exc}") from None
        if not isinstance(obj, kind):
            raise error(f"{what} {point.value!r} is not an instance of {kind.__name__}")
        found.append((point.value, obj))
    return found
