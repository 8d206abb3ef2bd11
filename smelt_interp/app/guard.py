"""Every server callback's inputs checked in one place, before the page's code runs.

Each page declares once, in `INPUTS`, the kind of value each of its controls carries (its
prop id, e.g. "attn-layer.value", -> a Kind); buttons' clicks, graphs' clicks and the address
bar have kinds by property (BY_PROPERTY). `Dashboard.callback` wraps every callback registered
on the app (the pages', the shared helpers' and Dash's own page router): a value of the wrong
kind (a layer "abc", a visit -1, a dict where text belongs, a string of megabytes), or a
SmeltError the callback raises (a prompt it cannot use, a layer the model does not run), is
answered with the page's message: the text in the page's message box and in its figures,
every other output left as it was. Any other exception is logged in one line and answered the
same way, so a request never ends in HTTP 500 with a traceback. Request bodies are capped
(MAX_REQUEST_BYTES; larger ones get HTTP 413 before they are read), parsed within bounds
(MAX_BODY_DEPTH) and checked in shape against the callback they name (its inputs, state and
outputs, and changedPropIds) before Dash reads them: a malformed one gets HTTP 400. A request
whose Host header is not the server's own address gets HTTP 403 (a page on another site that
reaches a loopback server through DNS rebinding sends its own host name), and a request for a
component file Dash does not serve gets HTTP 404."""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dash
from dash import no_update
from dash.exceptions import PreventUpdate

from smelt_interp.app.controls import stringify_id
from smelt_interp.errors import CallbackInputError, SmeltError
from smelt_interp.fields import is_int as _is_int
from smelt_interp.figures.theme import message_figure

LOG = logging.getLogger("smelt_interp.app")
MAX_REQUEST_BYTES = 1 << 20  # a callback request's body; the largest real one is a long prompt
MAX_PROMPT_CHARS = 65_536  # longer than any model's context, in bytes
MAX_NAME_CHARS = 256
MAX_INDEX = 1 << 20  # layers, visits, heads, tokens: far above any model's
MAX_BODY_DEPTH = 64  # nesting of a callback body: Dash's deepest real one (clickData) is ~6
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})  # as Jupyter allows by default
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})  # every address: any IP literal is the server's
WILDCARD_VALUES = (["ALL"], ["MATCH"], ["ALLSMALLER"])  # pattern-matching ids, as Dash sends them


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
URL_TEXT = text(MAX_REQUEST_BYTES)  # the address bar's path or query (prompts percent-encoded)
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


def check_inputs(kinds: Mapping[str, Kind], items: list) -> None:
    """Raise CallbackInputError for the first of Dash's input/state items (dicts with id,
    property and value; a list of them for a wildcard) whose value is not of its kind."""
    for item in items:
        for one in item if isinstance(item, list) else [item]:
            prop_id = f"{stringify_id(one['id'])}.{one['property']}"
            kind_of(kinds, prop_id).check(prop_id, one.get("value"))


def _answer_one(spec: Any, text: str) -> Any:
    """What one output shows for a refused request: the message box gets the text, a figure
    says it, everything else stays."""
    if isinstance(spec, list):  # a wildcard output: one value per matching component
        return [_answer_one(one, text) for one in spec] if spec else no_update
    prop = str(spec.get("property", "")).split("@")[0]
    is_message = str(spec.get("id", "")).endswith("-msg")
    if prop == "figure":
        return message_figure(text)
    if is_message and prop == "children":
        return text
    if is_message and prop == "style":
        return {"display": "block"}
    return no_update


def answer(outputs: Any, text: str) -> Any:
    """The return value of a refused callback whose outputs are `outputs` (Dash's
    outputs_list: one spec for a single output, a list of specs for several)."""
    if isinstance(outputs, dict):
        return _answer_one(outputs, text)
    return [_answer_one(spec, text) for spec in outputs]


def guard(func: Callable[..., Any], kinds: Mapping[str, Kind]) -> Callable[..., Any]:
    """`func` with its inputs checked first and its errors answered with the page's message."""

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        ctx = dash.callback_context
        try:
            check_inputs(kinds, [*ctx.inputs_list, *ctx.states_list])
            return func(*args, **kwargs)
        except PreventUpdate:
            raise
        except SmeltError as exc:
            return answer(ctx.outputs_list, str(exc))
        except Exception as exc:  # the last line of defence: one log line, never a 500
            LOG.error("callback %s failed: %s: %s", func.__name__, type(exc).__name__, exc)
            return answer(
                ctx.outputs_list,
                f"The server could not answer ({type(exc).__name__}); reload the page.",
            )

    return guarded


def _specs_ok(value: Any) -> bool:
    """An input, state or output entry: {"id": ..., "property": str, ...}, or a list of them
    (a wildcard)."""
    ok = lambda one: isinstance(one, dict) and "id" in one and isinstance(one.get("property"), str)
    return all(ok(one) for one in value) if isinstance(value, list) else ok(value)


def declared_outputs(key: str) -> list[tuple[Any, str]]:
    """(component id, property) of each output of the callback keyed `key` in callback_map
    ("id.prop", or "..id.prop...id2.prop.." for several; an id may be a JSON object)."""
    parts = key[2:-2].split("...") if key.startswith("..") else [key]
    out = []
    for part in parts:
        if part.startswith("{"):
            end = part.rindex("}") + 1
            out.append((json.loads(part[:end]), part[end + 1 :]))
        else:
            ident, _, prop = part.rpartition(".")
            out.append((ident, prop))
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
    from smelt_interp.atomic import parse_json

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


class Dashboard(dash.Dash):
    """dash.Dash whose every server callback runs behind `guard` with the app's `kinds`, and
    whose callback requests are capped in size and checked in shape (HTTP 400) before Dash
    reads them."""

    def __init__(self, *args: Any, kinds: Mapping[str, Kind] | None = None, **kwargs: Any):
        self.kinds: dict[str, Kind] = dict(kinds or {})
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

    def callback(self, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        register = super().callback(*args, **kwargs)
        return lambda func: register(guard(func, self.kinds))
