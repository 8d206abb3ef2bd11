"""The dashboard under many users: identical requests share one drawing and one forward pass, a
reloaded model is drawn afresh, a page lays out without running a model, and the figure theme's
quick template is the same template."""

from __future__ import annotations

import json
import threading
import time

import plotly.graph_objects as go
import plotly.io as pio
import pytest
import test_app

from smelt_interp.app.figure_cache import FigureCache
from smelt_interp.app.pages import PAGES, attention, routing
from smelt_interp.app.prompt_run import cached_run, prompt_labels
from smelt_interp.app.server import create_app
from smelt_interp.figures.theme import message_figure, set_template

PROMPT = "a prompt no page has seen"


pair, wb = test_app.pair, test_app.wb  # the dashboard tests' random-init pair (fixtures)


def count_forwards(models: dict, delay: float = 0.0) -> dict[str, int]:
    """Wrap each model's forward to count its calls (and take `delay` s longer, so that
    requests sent together overlap); returns the live counts."""
    counts = {name: 0 for name in models}
    for name, model in models.items():
        forward = model.forward

        def counted(*args, _name=name, _forward=forward, **kwargs):
            counts[_name] += 1
            time.sleep(delay)
            return _forward(*args, **kwargs)

        model.forward = counted
    return counts


def body(app, output_part: str, values: dict) -> dict:
    """The request a browser sends for the callback whose output key contains `output_part`,
    with each input's and state's value from `values` ("id.property" -> value, else None)."""
    key = next(k for k in app.callback_map if output_part in k and "@" not in k)
    cb = app.callback_map[key]
    outputs = [
        {
            "id": json.loads(p.rsplit(".", 1)[0]) if p.startswith("{") else p.rsplit(".", 1)[0],
            "property": p.rsplit(".", 1)[1],
        }
        for p in key.strip(".").split("...")
    ]

    def items(deps):
        return [{**d, "value": values.get(f"{d['id']}.{d['property']}")} for d in deps]

    return {
        "output": key,
        "outputs": outputs if key.startswith("..") else outputs[0],
        "inputs": items(cb["inputs"]),
        "state": items(cb["state"]),
        "changedPropIds": [],
    }


def post(app, request: dict) -> dict:
    response = app.server.test_client().post("/_dash-update-component", json=request)
    assert response.status_code == 200, response.get_data(as_text=True)[:300]
    return response.get_json()["response"]


ATTENTION = {
    "attn-model.value": "smelt",
    "attn-layer.value": 1,
    "attn-visit.value": 1,
    "attn-bos.value": ["skip"],
    "attn-applied.data": PROMPT,
}


def test_concurrent_identical_requests_draw_once_and_run_the_model_once(wb, pair, monkeypatch):
    app = create_app(wb)
    forwards = count_forwards(pair, delay=0.3)
    drawn = []
    grid_figure = attention.grid_figure

    def counted(*args):
        drawn.append(args[1:])
        time.sleep(0.3)  # long enough that the other request arrives meanwhile
        return grid_figure(*args)

    monkeypatch.setattr(attention, "grid_figure", counted)
    request = body(app, "attn-grid", ATTENTION)
    answers: list = []
    threads = [threading.Thread(target=lambda: answers.append(post(app, request))) for _ in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 2 and answers[0] == answers[1]
    assert len(drawn) == 1 and forwards == {"baseline": 0, "smelt": 1}
    grid = answers[0]['{"name":"attn-grid","type":"graph"}']["figure"]
    assert grid["layout"]["title"]["text"] == "smelt · layer 1 · visit 1"
    # the next user asking the same is answered from the cache; other inputs are drawn anew
    post(app, request)
    assert len(drawn) == 1
    post(app, body(app, "attn-grid", {**ATTENTION, "attn-layer.value": 2}))
    assert len(drawn) == 2 and forwards["smelt"] == 1  # same prompt: same forward pass


class FakeRegistry:
    """names and version() as ModelRegistry gives them, with a version a test can bump."""

    def __init__(self) -> None:
        self.names = ["smelt"]
        self.versions = {"smelt": 1}

    def version(self, name: str) -> int:
        return self.versions[name]


def test_figure_cache_keys_on_inputs_and_the_served_models_versions():
    registry = FakeRegistry()
    cache = FigureCache(registry, maxsize=2)  # type: ignore[arg-type]
    builds = []

    def build(text):
        builds.append(text)
        return (message_figure(text), text)

    first = cache.answer("view", ["a", 1], lambda: build("a"))
    assert isinstance(first[0], dict) and first[1] == "a"  # figures kept as Dash sends them
    assert first[0] == message_figure("a").to_plotly_json()
    assert cache.answer("view", ["a", 1], lambda: build("x")) is first and builds == ["a"]
    cache.answer("other view", ["a", 1], lambda: build("b"))
    cache.answer("view", ["a", 2], lambda: build("c"))
    assert builds == ["a", "b", "c"]
    registry.versions["smelt"] = 2  # the checkpoint was reloaded: drawn afresh
    cache.answer("view", ["a", 1], lambda: build("d"))
    registry.names = ["smelt", "baseline"]
    registry.versions["baseline"] = 1  # a model appeared
    cache.answer("view", ["a", 1], lambda: build("e"))
    assert builds == ["a", "b", "c", "d", "e"] and len(cache.lru) == 2  # bounded


@pytest.mark.parametrize(
    "state",
    [
        {},
        {"prompt": PROMPT},
        {"prompt": PROMPT, "model": "baseline", "layer": 2},
        {"prompt": "x" * 500},  # too long: the figures' callbacks say so
        {"model": "nope", "layer": -1, "head": 99, "token": 3, "prompt": PROMPT},
    ],
)
def test_no_page_runs_a_model_to_lay_out(wb, pair, state):
    forwards = count_forwards(pair)
    for page in PAGES:
        page.layout(wb, state)
    assert forwards == {"baseline": 0, "smelt": 0} and len(wb.prompts) == 0


def test_routing_token_choices_come_from_the_tokenizer_as_the_run_labels_them(wb, pair):
    forwards = count_forwards(pair)
    labels = prompt_labels(wb, "smelt", PROMPT)
    assert forwards["smelt"] == 0
    assert labels == cached_run(wb, "smelt", PROMPT).labels and labels[0] == "<bos>"
    layout = routing.layout(wb, {"prompt": PROMPT, "token": 4})
    dropdown = next(c for c in layout._traverse() if getattr(c, "id", None) == "routing-token")
    assert dropdown.value == 4 and len(dropdown.options) == len(PROMPT) + 1


def test_the_head_left_open_by_the_layout_is_the_one_with_most_structure(wb):
    app = create_app(wb)
    expected = cached_run(wb, "smelt", PROMPT).structured_head(1, 1)
    # the callback that picks it once the page is shown
    answer = post(app, body(app, "attn-head.value", {**ATTENTION, "attn-head.value": None}))
    assert answer["attn-head"]["value"] == expected
    # a head already chosen is kept
    kept = app.server.test_client().post(
        "/_dash-update-component",
        json=body(app, "attn-head.value", {**ATTENTION, "attn-head.value": 0}),
    )
    assert kept.status_code in (200, 204) and "attn-head" not in kept.get_data(as_text=True)
    # and the focused head drawn meanwhile is that head
    focus = post(app, body(app, "attn-focus", {**ATTENTION, "attn-head.value": None}))
    title = focus['{"name":"attn-focus","type":"graph"}']["figure"]["layout"]["title"]["text"]
    assert title == f"smelt · layer 1 · visit 1 · head {expected}"


def test_the_quick_template_is_plotlys_template():
    quick = go.Figure()
    set_template(quick)
    checked = go.Figure().update_layout(template="plotly_white")
    assert json.loads(quick.to_json()) == json.loads(checked.to_json())
    assert quick.layout.template == pio.templates["plotly_white"]
    # the figure still validates what is set on it afterwards
    with pytest.raises(ValueError):
        quick.update_layout(height="tall")
