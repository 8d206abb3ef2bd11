"""Every server callback's inputs checked before the page's code runs, and its failures answered
on the page. `guard(func, kinds)` wraps one callback: a value of the wrong kind (its prop id's
declared Kind, smelt_interp.app.value_kinds), or a SmeltError the callback raises (a prompt it
cannot use, a layer the model does not run), is answered with the page's message: the text in
the page's message box and in its figures, every other output left as it was. Any other
exception is logged in one line and answered the same way, so a request never ends in HTTP 500
with a traceback. smelt_interp.app.server wraps every callback registered on the app this way
(the pages', the shared helpers' and Dash's own page router)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import dash
from dash import no_update
from dash.exceptions import PreventUpdate

from smelt_interp.app.controls import stringify_id
from smelt_interp.app.value_kinds import Kind, kind_of
from smelt_interp.errors import SmeltError
from smelt_interp.figures.theme import message_figure

LOG = logging.getLogger("smelt_interp.app")


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
