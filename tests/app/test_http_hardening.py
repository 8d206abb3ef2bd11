"""The HTTP hardening's parser of Dash's callback keys, against the Dash that is installed: the
keys a real Dash app writes into callback_map (one output, several, pattern-matching ids, one
with a dot in a value, a duplicate output) read back as the outputs the callbacks declared, a
body shaped as Dash's page sends it passes the shape check and one naming other outputs does
not; and the installed Dash is one of the releases the parser was written for (the range pinned
in pyproject.toml)."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import dash
import tomllib
from dash import ALL, MATCH, Input, Output, State
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from smelt_interp.app import http_hardening
from smelt_interp.app.controls import stringify_id
from smelt_interp.app.http_hardening import declared_outputs, request_problem

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_installed_dash_is_one_the_parser_was_written_for():
    pinned = SpecifierSet(http_hardening.DASH_VERSIONS)
    installed = version("dash")
    assert installed in pinned, (
        f"Dash {installed} is outside {pinned}, the releases whose internal callback keys "
        "smelt_interp.app.http_hardening parses: check the parser against this Dash "
        "(tests/app/test_http_hardening.py), then widen DASH_VERSIONS and pyproject.toml together"
    )
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    [dash_dep] = [Requirement(d) for d in deps if Requirement(d).name == "dash"]
    assert dash_dep.specifier == pinned, "pyproject.toml pins Dash to another range"


# each callback: (its outputs, its inputs), registered on a plain Dash app in this order
CALLBACKS = [
    ([Output("one", "children")], [Input("a", "value")]),
    ([Output("two", "figure"), Output("three", "style")], [Input("a", "value")]),
    ([Output({"type": "note", "name": "v1.2"}, "children")], [Input("b", "value")]),
    ([Output({"type": "graph", "name": ALL}, "config")], [Input("a", "n_clicks")]),
    (
        [Output({"type": "cell", "index": MATCH}, "children")],
        [Input({"type": "cell", "index": MATCH}, "value")],
    ),
    (
        [Output("one", "children", allow_duplicate=True), Output("four", "data")],
        [Input("c", "value")],
    ),
]


def _app() -> tuple[dash.Dash, list[str]]:
    """A Dash app with CALLBACKS registered, and the callback_map key each one got."""
    app = dash.Dash(__name__)
    keys = []
    for outputs, inputs in CALLBACKS:
        before = set(app.callback_map)
        app.callback(*outputs, *inputs, State("s", "data"), prevent_initial_call=True)(
            lambda *args: None
        )
        [key] = set(app.callback_map) - before
        keys.append(key)
    return app, keys


def _as_json(component_id):
    """A component id as it travels in a request body (wildcards as Dash's page sends them)."""
    if isinstance(component_id, str):
        return component_id
    return {
        k: json.loads(v.to_json()) if hasattr(v, "to_json") else v for k, v in component_id.items()
    }


def test_dash_callback_keys_read_back_as_the_declared_outputs():
    _, keys = _app()
    for (outputs, _), key in zip(CALLBACKS, keys, strict=True):
        got = declared_outputs(key)
        assert len(got) == len(outputs), key
        for (ident, prop), output in zip(got, outputs, strict=True):
            assert stringify_id(ident) == stringify_id(_as_json(output.component_id)), key
            assert prop.split("@")[0] == output.component_property, key
            assert ("@" in prop) == bool(output.allow_duplicate), key


def _spec(output, value=None) -> dict:
    ident = output.component_id
    if isinstance(ident, dict):  # a matched component: concrete values where wildcards stand
        ident = {k: value if hasattr(v, "to_json") else v for k, v in ident.items()}
    return {"id": ident, "property": output.component_property}


def _body(key: str, outputs: list, inputs: list, many: bool) -> dict:
    """A request body as Dash's page sends it for the callback keyed `key`."""
    specs = []
    for output in outputs:
        ident = output.component_id
        if isinstance(ident, dict) and ALL in ident.values():
            specs.append([_spec(output, "g1"), _spec(output, "g2")])  # one per matching graph
        else:
            specs.append(_spec(output, 3))
    return {
        "output": key,
        "outputs": specs if many else specs[0],
        "inputs": [{**_spec(i, 3), "value": 1} for i in inputs],
        "state": [{"id": "s", "property": "data", "value": None}],
        "changedPropIds": [],
    }


def test_a_body_as_dash_sends_it_passes_and_one_for_other_outputs_does_not():
    app, keys = _app()
    for (outputs, inputs), key in zip(CALLBACKS, keys, strict=True):
        body = _body(key, outputs, inputs, many=len(outputs) > 1)
        assert request_problem(body, app.callback_map) is None, key
        other = _body(
            key, [Output("elsewhere", "children")] * len(outputs), inputs, len(outputs) > 1
        )
        assert request_problem(other, app.callback_map) is not None, key
