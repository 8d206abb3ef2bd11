"""A page's state in the URL query string, so a view can be shared: which model, prompt,
layer, visit, head and so on. Decoding is forgiving (an unknown key or a malformed value is
dropped, never an error); encoding is canonical (fixed key order, None omitted)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

# key -> type; the order is the order keys appear in a URL
FIELDS: dict[str, type] = {
    "model": str,
    "layer": int,
    "visit": int,
    "head": int,
    "bos": bool,
    "token": int,
    "value": str,
    "pairs": int,
    "depth": int,
    "demos": int,
    "seed": int,
    "prompt": str,
    "dyck": str,
}
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


def decode_state(search: str | None) -> dict[str, Any]:
    """'?model=smelt&layer=1' -> {'model': 'smelt', 'layer': 1}. Unknown keys and values that
    do not parse are dropped; the last of repeated keys wins."""
    out: dict[str, Any] = {}
    for key, raw in parse_qsl((search or "").lstrip("?"), keep_blank_values=True):
        kind = FIELDS.get(key)
        if kind is None:
            continue
        try:
            out[key] = _parse(kind, raw)
        except ValueError:
            continue
    return out


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def encode_state(state: Mapping[str, Any]) -> str:
    """{'layer': 1, 'model': 'smelt'} -> '?model=smelt&layer=1' (known keys only, in FIELDS
    order, None dropped); '' for an empty state."""
    pairs = [(key, _format(state[key])) for key in FIELDS if state.get(key) is not None]
    return "?" + urlencode(pairs) if pairs else ""


def merge_state(search: str | None, updates: Mapping[str, Any]) -> str:
    """The query string `search` with `updates` applied (a None value removes its key)."""
    state = decode_state(search)
    for key, value in updates.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return encode_state(state)
