"""The dashboard's HTTP front door, hardened against requests its own page never sends.
`HardenedDash` is dash.Dash whose Flask server refuses, before Dash reads anything:

- a request whose Host header is not the server's own address (HTTP 403): a page on another
  site that reaches a loopback server through DNS rebinding sends its own host name;
- a callback request body over MAX_REQUEST_BYTES (HTTP 413, before it is read), nested deeper
  than MAX_BODY_DEPTH, or not shaped like the callback it names: its inputs, state and outputs
  and its changedPropIds (HTTP 400);
- a request for a component file Dash does not serve (HTTP 404, not a traceback).

The shape check reads Dash's internal callback key format with Dash's own reader (the keys of
app.callback_map, which Dash's create_callback_id writes and its split_callback_id splits; the
ids are then unescaped and JSON ids read): "id.prop" for one output,
"..id.prop...id2.prop.." for several, an id JSON for a pattern-matching one, a dot inside an id
escaped as "\\.", "@<hash>" after a duplicate output's property. That format is no public API:
DASH_VERSIONS is the range of Dash releases it was checked against (pinned in pyproject.toml),
and tests/app/test_http_hardening.py checks the parser against the keys the installed Dash
writes."""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Mapping
from typing import Any

import dash
from dash._utils import split_callback_id  # the reader of the keys create_callback_id writes

from smelt_interp.app.value_kinds import MAX_NAME_CHARS, MAX_URL_CHARS
from smelt_interp.errors import CallbackInputError

LOG = logging.getLogger("smelt_interp.app")
DASH_VERSIONS = ">=3.0,<5"  # the Dash releases whose callback keys the parser below reads
MAX_REQUEST_BYTES = MAX_URL_CHARS  # a callback request's body: the largest real one carries a
# long prompt, in a prompt box or percent-encoded in the address bar
MAX_BODY_DEPTH = 64  # nesting of a callback body: Dash's deepest real one (clickData) is ~6
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})  # as Jupyter allows by default
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})  # every address: any IP literal is the server's
WILDCARD_VALUES = (["ALL"], ["MATCH"], ["ALLSMALLER"])  # pattern-matching ids, as Dash sends them


def _specs_ok(value: Any) -> bool:
    """An input, state or output entry: {"id": ..., "property": str, ...}, or a list of them
    (a wildcard)."""
    ok = lambda one: isinstance(one, dict) and "id" in one and isinstance(one.get("property"), str)
    return all(ok(one) for one in value) if isinstance(value, list) else ok(value)


def declared_outputs(key: str) -> list[tuple[Any, str]]:
    """(component id, property) of each output of the callback keyed `key` in callback_map,
    split by Dash's own split_callback_id; the id is then unescaped ("\\." for a dot inside
    it) and read as JSON where it is a pattern-matching one."""
    parsed = split_callback_id(key)
    out = []
    for part in parsed if isinstance(parsed, list) else [parsed]:
        ident = part["id"].replace("\\.", ".")
        out.append((json.loads(ident) if ident.startswith("{") else ident, part["property"]))
    return out


def _output_matches(spec: dict, ident: Any, prop: str) -> bool:
    """Whether a body's output spec names the declared output (id, property): the same id, or
    for a pattern-matching id the same keys with a plain value wherever a wildcard stands."""
    if str(spec["property"]).split("@")[0] != prop.split("@")[0]:
        return False
    given = spec["id"]
    if isinstance(ident, str):
        return given == ident
    if not isinstance(given, dict) or set(given) != set(ident):
        return False
    plain = (str, int, float, bool)
    return all(
        isinstance(given[k], plain) or given[k] in WILDCARD_VALUES
        if v in WILDCARD_VALUES
        else given[k] == v
        for k, v in ident.items()
    )


def _outputs_problem(key: str, outputs: Any) -> str | None:
    declared = declared_outputs(key)
    shaped = outputs if isinstance(outputs, list) and len(declared) > 1 else [outputs]
    if len(shaped) != len(declared) or not all(_specs_ok(spec) for spec in shaped):
        return "its outputs do not match the callback's"
    for (ident, prop), entry in zip(declared, shaped, strict=True):
        many = isinstance(ident, dict) and any(
            v in (["ALL"], ["ALLSMALLER"]) for v in ident.values()
        )
        if many != isinstance(entry, list):  # a list of specs only where the id matches many
            return "its outputs are not the callback's"
        for spec in entry if many else [entry]:
            if not _output_matches(spec, ident, prop):
                return "its outputs are not the callback's"
    return None


def request_problem(body: Any, callback_map: Mapping[str, dict]) -> str | None:
    """Why a callback request's body is not one Dash's page would send, or None: it must name
    a server callback and carry its inputs, state and outputs in their declared shapes, the
    outputs those the callback declares, and changedPropIds as a list of prop ids."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    output = body.get("output")
    callback = callback_map.get(output) if isinstance(output, str) else None
    if callback is None or "callback" not in callback:
        return "no server callback has these outputs"
    for where in ("inputs", "state"):
        items = body.get(where, [])
        if not isinstance(items, list) or len(items) != len(callback[where]):
            return f"its {where} do not match the callback's"
        if not all(_specs_ok(item) for item in items):
            return f"its {where} are not ids with properties"
    changed = body.get("changedPropIds", [])
    if not isinstance(changed, list) or not all(
        isinstance(c, str) and len(c) <= MAX_NAME_CHARS * 4 for c in changed
    ):
        return "its changedPropIds are not a list of prop ids"
    return _outputs_problem(output, body.get("outputs"))


def body_of(data: bytes) -> Any:
    """A callback request's JSON body, or None when it is not JSON within MAX_BODY_DEPTH (a
    deep one would make a parser recurse without bound)."""
    from smelt_interp.files import parse_json

    try:
        return parse_json(data.decode("utf-8"), "body", CallbackInputError, MAX_BODY_DEPTH)
    except (CallbackInputError, UnicodeDecodeError, ValueError):
        return None


def host_name(header: str) -> str:
    """The host of a Host header ("127.0.0.1:8050", "[::1]:8050", "Example.COM."), lower case."""
    host = header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class HardenedDash(dash.Dash):
    """dash.Dash that answers only requests for its own address (403), caps callback request
    bodies (413) and checks them in shape (400) before Dash reads them, and answers a component
    file it does not serve with 404."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.hosts: set[str] = set(LOOPBACK_HOSTS)  # Host headers answered; run() adds its own
        super().__init__(*args, **kwargs)
        self.server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
        self.server.before_request(self._check_host)
        self.server.before_request(self._check_request)
        from dash.exceptions import DependencyException  # an unregistered component file

        self.server.register_error_handler(DependencyException, self._not_served)

    def run(self, *args: Any, host: str = "127.0.0.1", **kwargs: Any) -> Any:
        """dash.Dash.run, answering requests addressed to `host` besides the loopback names."""
        self.hosts.add(host_name(host))
        return super().run(*args, host=host, **kwargs)

    def _check_host(self) -> Any:
        """Flask's before_request: a Host header naming another server gets 403 and one line."""
        import flask

        host = host_name(flask.request.host)
        if host in self.hosts or (_is_ip(host) and self.hosts & WILDCARD_BINDS):
            return None
        LOG.warning("refused a request for host %r", host[:80])
        return flask.Response(
            "error: this server answers requests for its own address only\n",
            status=403,
            mimetype="text/plain",
        )

    def _not_served(self, exc: Exception) -> Any:
        """A component file (or other resource) Dash does not register: 404, one log line."""
        import flask

        LOG.warning("not served: %s", flask.request.path[:200])
        return flask.Response("error: not found\n", status=404, mimetype="text/plain")

    def _check_request(self) -> Any:
        """Flask's before_request: a malformed callback request gets 400 and one line."""
        import flask

        request = flask.request
        if request.method != "POST" or not request.path.endswith("/_dash-update-component"):
            return None
        problem = request_problem(body_of(request.get_data(cache=True)), self.callback_map)
        if problem is None:
            return None
        LOG.warning("refused a callback request: %s", problem)
        return flask.Response(f"error: {problem}\n", status=400, mimetype="text/plain")
