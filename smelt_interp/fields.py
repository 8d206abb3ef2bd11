"""Typed config fields: a dataclass field carries its allowed values in its metadata (an integer
or real range, a set of choices), and `check_fields` checks every such field of an instance, so
each config states its bounds once, next to the field, and validates itself in `__post_init__`.
`from_mapping` builds a config from plain data (JSON, a checkpoint, `--set`) with one-line
errors. The integer and real tests here are the package's one home for them."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from smelt_interp.errors import ConfigError, SmeltError

T = TypeVar("T")
MAX_SHOWN = 100  # characters of a user's value or name that an error message repeats
MAX_LISTED = 12  # an unknown-field message lists the known fields when there are this few


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def shown(value: Any, limit: int = MAX_SHOWN) -> str:
    """`repr(value)` cut to about `limit` characters, so an error line stays one short line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def check_int(
    name: str, value: Any, low: int, high: int, error: type[SmeltError] = ConfigError
) -> None:
    """`value` is an integer in low..high, else `error` naming `name` and the range."""
    if not is_int(value) or not low <= value <= high:
        allowed = (
            f"a positive integer up to {high:,}" if low == 1 else f"an integer in {low}..{high:,}"
        )
        raise error(f"{name} must be {allowed}, got {shown(value)}")


def check_real(
    name: str,
    value: Any,
    low: float,
    high: float | None,
    interval: str = "[]",
    error: type[SmeltError] = ConfigError,
) -> None:
    """`value` is a finite number in the interval: "[]" closed, "(]" or "()" open at that end;
    `high` None for unbounded."""
    ok = is_real(value)
    if ok:
        above = value > low if interval[0] == "(" else value >= low
        below = high is None or (value < high if interval[1] == ")" else value <= high)
        ok = above and below
    if not ok:
        bound = "inf)" if high is None else f"{high:g}{interval[1]}"
        raise error(
            f"{name} must be a finite number in {interval[0]}{low:g}, {bound}, got {shown(value)}"
        )


def int_field(default: int, low: int, high: int) -> Any:
    """A dataclass field holding an integer in low..high."""
    return dataclasses.field(default=default, metadata={"int": (low, high)})


def int_bounds(cls: type, name: str) -> tuple[int, int]:
    """The (low, high) range an `int_field` of the dataclass `cls` allows."""
    return cls.__dataclass_fields__[name].metadata["int"]


def real_field(default: float, low: float, high: float | None, interval: str = "[]") -> Any:
    """A dataclass field holding a finite number in an interval (see check_real)."""
    return dataclasses.field(default=default, metadata={"real": (low, high, interval)})


def choice_field(default: Any, options: tuple[Any, ...]) -> Any:
    """A dataclass field holding one of `options` (strings, or integers)."""
    return dataclasses.field(default=default, metadata={"choice": options})


def names_field(default: tuple[str, ...], options: tuple[str, ...]) -> Any:
    """A dataclass field holding a non-empty tuple of names from `options` (a JSON list too)."""
    return dataclasses.field(default=default, metadata={"names": options})


def ids_field() -> Any:
    """A dataclass field holding a tuple of distinct non-negative integers, empty by default (a
    JSON list too); the owner checks their upper bound, which depends on its other fields."""
    return dataclasses.field(default=(), metadata={"ids": True})


def bool_field(default: bool) -> Any:
    """A dataclass field holding true or false."""
    return dataclasses.field(default=default, metadata={"bool": True})


def check_fields(
    obj: Any,
    error: type[SmeltError] = ConfigError,
    prefix: str = "",
    names: Mapping[str, str] | None = None,
) -> None:
    """Check every field of the dataclass instance `obj` whose metadata states its values;
    `prefix` goes before field names in messages ("dyck." for a nested spec), and `names` gives
    a field another name there."""
    names = names or {}
    for f in dataclasses.fields(obj):
        value, meta = getattr(obj, f.name), f.metadata
        name = names.get(f.name, prefix + f.name)
        if "int" in meta:
            check_int(name, value, *meta["int"], error=error)
        elif "real" in meta:
            check_real(name, value, *meta["real"], error=error)
        elif "choice" in meta:
            options = meta["choice"]
            if type(value) is not type(options[0]) or value not in options:
                raise error(
                    f"{name} must be one of {', '.join(map(str, options))}, got {shown(value)}"
                )
        elif "names" in meta:
            options = meta["names"]
            if (
                not isinstance(value, tuple)
                or not value
                or not all(isinstance(v, str) and v in options for v in value)
            ):
                raise error(
                    f"{name} must be a non-empty list of {', '.join(options)}, got {shown(value)}"
                )
        elif "ids" in meta:
            if (
                not isinstance(value, tuple)
                or not all(is_int(v) and v >= 0 for v in value)
                or len(set(value)) != len(value)
            ):
                raise error(
                    f"{name} must be a list of distinct non-negative integers, got {shown(value)}"
                )
        elif "bool" in meta and not isinstance(value, bool):
            raise error(f"{name} must be true or false, got {shown(value)}")


def plain(value: Any) -> Any:
    """`value` as JSON-ready data: dataclasses as dicts of their fields, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def known_fields(cls: type, data: Any, what: str) -> dict[str, Any]:
    """`data` as keyword arguments of the dataclass `cls`; a ConfigError if it is not a mapping
    or names a field `cls` lacks (`what` names the config in the message). A JSON list given to
    a tuple field (`names_field`, `ids_field`) becomes a tuple."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what} must be a mapping of its fields, got {type(data).__name__}")
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(shown(name) for name in set(data) - set(known))
    if unknown:
        use = f"; use {', '.join(known)}" if len(known) <= MAX_LISTED else ""
        raise ConfigError(f"unknown {what} field(s) {', '.join(unknown)}{use}")
    tuples = {f.name for f in dataclasses.fields(cls) if {"names", "ids"} & set(f.metadata)}
    return {k: tuple(v) if k in tuples and isinstance(v, list) else v for k, v in data.items()}


def from_mapping(cls: type[T], data: Any, what: str) -> T:
    """An instance of the self-validating dataclass `cls` from plain data: unknown fields, a
    non-mapping and invalid values are one-line ConfigErrors that start with `what`; a JSON list
    given to a tuple field becomes a tuple."""
    if isinstance(data, cls):
        return data
    fields = known_fields(cls, data, what)
    with _named(what):
        return cls(**fields)


def replace_fields(obj: T, changes: Mapping[str, Any], what: str) -> T:
    """A copy of the self-validating dataclass instance `obj` with the fields `changes` names
    replaced (`dataclasses.replace`, so no round trip through plain data), checked and worded
    as `from_mapping` would check and word the whole: the same one-line ConfigErrors."""
    fields = known_fields(type(obj), changes, what)
    with _named(what):
        return dataclasses.replace(obj, **fields)


@contextlib.contextmanager
def _named(what: str) -> Iterator[None]:
    """A SmeltError other than a ConfigError raised inside, as a ConfigError that starts with
    `what` (a ConfigError already names its field)."""
    try:
        yield
    except ConfigError:
        raise
    except SmeltError as exc:
        raise ConfigError(f"{what}: {exc}") from None
