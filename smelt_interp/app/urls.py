"""A page's state in the URL query string, so a view can be shared: which model, prompt, layer,
visit, head and so on. Each page owns its keys: it declares them with their types, in the order
they appear in a URL (`QUERY = {"model": str, "layer": int}`), and these helpers read and write
a query string by that mapping.

Decoding is forgiving: a key the page does not own or a value that does not parse is dropped,
never an error, and the last of repeated keys wins. Encoding is canonical: the mapping's key
order, None omitted. When a page writes its state back (`merge`, `write_to_url`), keys it does
not own pass through untouched, so what one page put in the URL survives a visit to another."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

from dash import Input, Output, State

Query = Mapping[str, type]  # a page's keys -> their types (str, int or bool)
URL = "url"  # the id of the app's dcc.Location that pages write their state into

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _parse(kind: type, raw: str) -> Any:
    if kind is bool:
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(raw)
    if kind is int:
        return int(raw)
    return raw


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _urlencode(pairs: list[tuple[str, str]]) -> str:
    """urlencode, with text UTF-8 cannot hold (a lone surrogate a browser may paste) as '?'."""
    return urlencode(pairs, errors="replace")


def _pairs(search: str | None) -> list[tuple[str, str]]:
    return parse_qsl((search or "").lstrip("?"), keep_blank_values=True)


def _decode_pairs(query: Query, pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in pairs:
        kind = query.get(key)
        if kind is None:
            continue
        try:
            out[key] = _parse(kind, raw)
        except ValueError:
            continue
    return out


def decode(query: Query, search: str | None) -> dict[str, Any]:
    """'?model=smelt&layer=1' -> {'model': 'smelt', 'layer': 1} for the keys in `query`."""
    return _decode_pairs(query, _pairs(search))


def decode_params(query: Query, params: Mapping[str, Any]) -> dict[str, Any]:
    """The same from Dash pages' layout keyword arguments, where a repeated key arrives as a
    list ({'layer': ['1', '2']} -> {'layer': 2}); arguments that are not strings are ignored."""
    pairs = []
    for key, value in params.items():
        for raw in value if isinstance(value, list) else [value]:
            if isinstance(raw, str):
                pairs.append((key, raw))
    return _decode_pairs(query, pairs)


def encode(query: Query, state: Mapping[str, Any]) -> str:
    """{'layer': 1, 'model': 'smelt'} -> '?model=smelt&layer=1' (keys of `query` only, in its
    order, None dropped); '' for an empty state."""
    pairs = [(key, _format(state[key])) for key in query if state.get(key) is not None]
    return "?" + _urlencode(pairs) if pairs else ""


def merge(query: Query, search: str | None, updates: Mapping[str, Any]) -> str:
    """The query string `search` with `updates` to the page's keys applied (a None value
    removes its key): the page's keys first, canonical, then the other keys as they were."""
    state = decode(query, search)
    for key, value in updates.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    own = encode(query, state).lstrip("?")
    others = _urlencode([(key, raw) for key, raw in _pairs(search) if key not in query])
    joined = "&".join(part for part in (own, others) if part)
    return "?" + joined if joined else ""


def write_to_url(app: Any, query: Query, sources: Mapping[str, Input]) -> None:
    """Register the callback that writes a page's keys into the URL whenever one of `sources`
    (key -> the Input holding its value) changes. A bool key takes its value's truth (a
    Checklist's value is the list of ticked boxes)."""
    keys = list(sources)

    @app.callback(
        Output(URL, "search", allow_duplicate=True),
        *(sources[key] for key in keys),
        State(URL, "search"),
        prevent_initial_call=True,
    )
    def _to_url(*args):
        *values, search = args
        state = {k: bool(v) if query[k] is bool else v for k, v in zip(keys, values)}
        return merge(query, search, state)
