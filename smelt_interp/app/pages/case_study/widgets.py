"""Control widgets the case study's views share: a clamped integer from a URL or a number box,
a number box and a dropdown whose options a callback fills."""

from __future__ import annotations

from typing import Any

from dash import dcc

from smelt_interp.app.controls import Control


def clamp(value: Any, default: int, lo: int, hi: int) -> int:
    """`value` as an integer within lo..hi; `default` when it is not a number."""
    try:
        return min(hi, max(lo, int(value)))
    except (TypeError, ValueError):
        return default


def number_box(control: Control, value: int, lo: int, hi: int) -> dcc.Input:
    return dcc.Input(
        id=control.id,
        type="number",
        value=value,
        min=lo,
        max=hi,
        step=1,
        className="num",
        debounce=True,
    )


def dropdown(control: Control, value: Any) -> dcc.Dropdown:
    """The dropdown of `control` at `value` (its URL value); its options come from a callback."""
    return dcc.Dropdown(id=control.id, value=value, clearable=False, className="case-dropdown")
