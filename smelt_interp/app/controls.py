"""A page's controls, declared once: each control's component id, the property that holds its
value, the kind of value the guard accepts there (a Kind of smelt_interp.app.value_kinds,
imported as `kind`) and, for a control whose value is part of the page's URL state, the type of
that value in the query string. The page's other tables are derived from this one declaration:

    CONTROLS = Controls(
        model=Control("attn-model", "value", kind.NAME, url=str),
        text=Control("attn-prompt", "value", kind.PROMPT),  # not in the URL
    )
    QUERY = CONTROLS.query       # {"model": str}: the URL keys, in declaration order
    INPUTS = CONTROLS.kinds      # {"attn-model.value": kind.NAME, "attn-prompt.value": ...}
    CONTROLS.inputs("model")     # [Input("attn-model", "value")] for a callback
    CONTROLS.id("model")         # "attn-model" for the layout

A control's name is its URL key when it has one."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dash import Input, Output, State

from smelt_interp.app.value_kinds import Kind


def stringify_id(component_id: str | Mapping[str, Any]) -> str:
    """A component id as Dash writes it in a prop id: a string as is, a pattern-matching id as
    JSON with sorted keys and no spaces ('{"name":"attn-grid","type":"graph"}')."""
    if isinstance(component_id, str):
        return component_id
    return json.dumps(dict(component_id), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Control:
    """One control: component `id`, the `prop` holding its value, the `kind` of that value,
    and `url`, the type of its URL value (str, int or bool), None when it is not in the URL."""

    id: str
    prop: str
    kind: Kind
    url: type | None = None

    @property
    def prop_id(self) -> str:
        return f"{self.id}.{self.prop}"

    @property
    def input(self) -> Input:
        return Input(self.id, self.prop)

    @property
    def state(self) -> State:
        return State(self.id, self.prop)

    def output(self, prop: str | None = None, **kwargs: Any) -> Output:
        """An Output to this control's `prop` (default: its value's property)."""
        return Output(self.id, prop or self.prop, **kwargs)


class Controls(Mapping[str, Control]):
    """A page's controls by name, in declaration order (the URL's order)."""

    def __init__(self, **controls: Control) -> None:
        self._controls = dict(controls)

    def __getitem__(self, name: str) -> Control:
        return self._controls[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._controls)

    def __len__(self) -> int:
        return len(self._controls)

    def id(self, name: str) -> str:
        return self[name].id

    @property
    def query(self) -> dict[str, type]:
        """The page's URL keys and their types (smelt_interp.app.urls.Query)."""
        return {name: c.url for name, c in self.items() if c.url is not None}

    @property
    def kinds(self) -> dict[str, Kind]:
        """The kind of each control's value by prop id, for the guard."""
        return {c.prop_id: c.kind for c in self.values()}

    def inputs(self, *names: str) -> list[Input]:
        """Inputs of the named controls, in that order (default: the URL's controls)."""
        return [self[name].input for name in names or self.query]

    def states(self, *names: str) -> list[State]:
        return [self[name].state for name in names]

    def url_sources(self) -> dict[str, Input]:
        """URL key -> the Input holding its value (for urls.write_to_url)."""
        return {name: self[name].input for name in self.query}
