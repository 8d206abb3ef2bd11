"""The kinds of value a dashboard control may send, and their bounds: the vocabulary each page
uses to declare its controls (smelt_interp.app.controls) and the callback wrapper checks
(smelt_interp.app.guarded). A Kind is a name and a check that says why a value is not of it:
a layer "abc", a visit -1, a dict where text belongs, a string of megabytes. Buttons' clicks,
graphs' clicks and the address bar have kinds by property (BY_PROPERTY), whatever their page."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from smelt_interp.errors import CallbackInputError
from smelt_interp.fields import is_int as _is_int

MAX_URL_CHARS = 1 << 20  # the address bar's path or query: a prompt percent-encoded
MAX_PROMPT_CHARS = 65_536  # longer than any model's context, in bytes
MAX_NAME_CHARS = 256
MAX_INDEX = 1 << 20  # layers, visits, heads, tokens: far above any model's


@dataclass(frozen=True)
class Kind:
    """One kind of callback value: `why(value)` is None when the value is acceptable, else a
    short reason for the page's message."""

    name: str
    why: Callable[[Any], str | None]

    def check(self, prop_id: str, value: Any) -> None:
        reason = self.why(value)
        if reason is not None:
            raise CallbackInputError(
                f"The page sent {prop_id} a value it never sends ({reason}); "
                "reload the page to continue."
            )


def text(max_chars: int, optional: bool = True) -> Kind:
    """A string of at most `max_chars` characters (or None when `optional`)."""

    def why(value: Any) -> str | None:
        if value is None:
            return None if optional else "empty"
        if not isinstance(value, str):
            return f"{type(value).__name__}, not text"
        if len(value) > max_chars:
            return f"{len(value):,} characters, at most {max_chars:,} allowed"
        return None

    return Kind(f"text<={max_chars}", why)


def index(hi: int = MAX_INDEX, optional: bool = True) -> Kind:
    """An integer 0..hi (or None when `optional`); the page clamps it to the model."""

    def why(value: Any) -> str | None:
        if value is None:
            return None if optional else "empty"
        if not _is_int(value):
            return f"{type(value).__name__}, not an integer"
        if not 0 <= value <= hi:
            return f"{value} is outside 0..{hi}"
        return None

    return Kind(f"index<={hi}", why)


def choice(*options: str) -> Kind:
    """One of `options`."""

    def why(value: Any) -> str | None:
        if isinstance(value, str) and value in options:
            return None
        return f"not one of {', '.join(options)}"

    return Kind(f"one of {options}", why)


def _path_why(value: Any) -> str | None:
    reason = URL_TEXT.why(value)
    if reason is None and isinstance(value, str) and not value.startswith("/"):
        return "a path that does not start with /"
    return reason


def _number_why(value: Any) -> str | None:
    if value is None or _is_int(value):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a finite number"
    if isinstance(value, str):
        return None if len(value) <= 32 else "a number of more than 32 characters"
    return f"{type(value).__name__}, not a number"


def _flags_why(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > 32:
        return "not a list of ticked boxes"
    if not all(isinstance(v, str) and len(v) <= MAX_NAME_CHARS for v in value):
        return "a ticked box that is not a short text"
    return None


def _click_why(value: Any) -> str | None:
    """Plotly's clickData: {"points": [{"curveNumber": int, ...}, ...]} or None."""
    if value is None:
        return None
    points = value.get("points") if isinstance(value, dict) else None
    if not isinstance(points, list):
        return "click data without a list of points"
    for point in points[:1]:
        number = point.get("curveNumber") if isinstance(point, dict) else None
        if not (_is_int(number) and 0 <= number <= MAX_INDEX):
            return "a clicked point without a curve number"
    return None


NAME = text(MAX_NAME_CHARS)  # a model name or another option's text
PROMPT = text(MAX_PROMPT_CHARS)  # a prompt box or the store of the prompt last run
URL_TEXT = text(MAX_URL_CHARS)  # the address bar's path or query (prompts percent-encoded)
PATH = Kind("path", _path_why)  # the address bar's path
INDEX = index()
NUMBER = Kind("number", _number_why)  # a number box: the page clamps it (empty is None)
FLAGS = Kind("flags", _flags_why)  # a Checklist's ticked values
CLICK = Kind("click", _click_why)
CLICKS = index(hi=1 << 53)  # a button's n_clicks
ANY = Kind("any", lambda value: None)  # a value the callback ignores (a trigger)

# Kinds every component of these properties has, whatever its page.
BY_PROPERTY: dict[str, Kind] = {
    "n_clicks": CLICKS,
    "clickData": CLICK,
    "pathname": PATH,
    "search": URL_TEXT,
}


def kind_of(kinds: Mapping[str, Kind], prop_id: str) -> Kind:
    """The declared kind of `prop_id` ("id.property"), else its property's, else ANY."""
    if prop_id in kinds:
        return kinds[prop_id]
    return BY_PROPERTY.get(prop_id.rsplit(".", 1)[-1], ANY)
