"""The dashboard against a hostile or careless client: command line flags that cannot work are one
line and exit 2; every server callback, sent values the UI never sends, answers without HTTP 500
or a traceback (with the page's message where it has one); request bodies are capped; the server
answers concurrent clients, computing different models and serving cached answers in parallel."""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from dash._utils import split_callback_id
from helpers.bad_input import assert_one_line_error, run_command
from hypothesis import given, settings
from hypothesis import strategies as st

from smelt_interp.app import http_hardening, value_kinds
from smelt_interp.app.controls import stringify_id
from smelt_interp.app.lru import LRU
from smelt_interp.app.pages import PAGES, pattern_cap
from smelt_interp.app.prompt_run import cached_run
from smelt_interp.app.registry import ModelRegistry
from smelt_interp.app.served import Served, shortest_context
from smelt_interp.app.server import NAV, create_app
from smelt_interp.checkpoint import save_checkpoint
from smelt_interp.data.dyck_text import generate_dyck
from smelt_interp.errors import CallbackInputError

UPDATE = "/_dash-update-component"
HUGE = "x" * 100_000  # over the prompt cap; six of them stay under the request cap
HOSTILE: list[Any] = [
    "abc",
    None,
    -1,
    10**12,
    2.5,
    1e300,
    math.nan,
    math.inf,
    True,
    "",
    "\ud800",
    HUGE,
    {"a": 1},
    [1, [2]],
    [],
    {"points": [{"curveNumber": -3}]},
]


@pytest.fixture(scope="module")
def models():
    import torch
    from conftest import TINY_FIELDS

    from smelt_interp.config import ModelConfig
    from smelt_interp.model.transformer import SmeltModel

    fields = {**TINY_FIELDS, "max_seq_len": 128}
    torch.manual_seed(0)
    return {
        "baseline": SmeltModel(ModelConfig.baseline(**fields)).eval(),
        "smelt": SmeltModel(ModelConfig.smelt(**fields)).eval(),
    }


@pytest.fixture(scope="module")
def wb(models) -> Served:
    return Served(ModelRegistry.from_models(models))


@pytest.fixture(scope="module")
def app(wb):
    app = create_app(wb)
    app.server.test_client().get("/")  # Dash registers its page router on the first request
    return app


# ----- the command line ---------------------------------------------------------------------
@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port in use, so that a flag the app wrongly accepts fails fast instead of serving."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--threads", "-1"], "threads"),
        (["--threads", "0"], "threads"),
        (["--threads", "100000"], "threads"),
        (["--device", "cuda/foo"], "device"),
        (["--device", "meta"], "device"),
        (["--device", "mps"], "device"),
        (["--device", "cuda:99"], "device"),
        pytest.param(
            ["--device", "cuda"],
            "device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available"),
        ),
        (["--port", "70000"], "port"),
    ],
)
def test_app_flags_that_cannot_work_give_one_line(tmp_path, models, taken_port, args, needle):
    ckpt = save_checkpoint(tmp_path / "smelt" / "ckpt.pt", models["smelt"])
    port = [] if "--port" in args else ["--port", taken_port]
    code, _, err = run_command("smelt_interp.app", ckpt, *port, *args)
    assert_one_line_error(code, err, needle)


# ----- callback values the UI never sends ---------------------------------------------------
def _id(text: str) -> Any:
    return json.loads(text) if text.startswith("{") else text


def _outputs(key: str) -> Any:
    """Dash's `outputs` for the callback whose output key is `key` (the nav bar's wildcard
    outputs spelled out, one per link)."""
    parts = split_callback_id(key)
    specs = []
    for part in parts if isinstance(parts, list) else [parts]:
        oid = _id(part["id"])
        if isinstance(oid, dict) and oid.get("type") == "nav":
            specs.append([{"id": {**oid, "path": p}, "property": part["property"]} for p, _ in NAV])
        else:
            specs.append({"id": oid, "property": part["property"]})
    return specs if isinstance(parts, list) else specs[0]


def _walk(component: Any) -> Iterator[Any]:
    if not hasattr(component, "to_plotly_json"):
        return
    yield component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        yield from _walk(child)


@pytest.fixture(scope="module")
def valid_values(app, wb) -> dict[str, Any]:
    """A value the UI would send for each prop id: what the pages' default layouts hold."""
    values: dict[str, Any] = {"url.pathname": "/", "url.search": "", "_pages_location.search": ""}
    values["_pages_location.pathname"] = "/attention"
    for root in [app.layout, *(page.layout(wb, {}) for page in PAGES)]:
        for c in _walk(root):
            cid = getattr(c, "id", None)
            if cid is None:
                continue
            sid = stringify_id(cid) if isinstance(cid, dict) else cid
            for prop in ("value", "data", "n_clicks"):
                if getattr(c, prop, None) is not None:
                    values[f"{sid}.{prop}"] = getattr(c, prop)
    return values


def _server_callbacks(app) -> list[tuple[str, list[tuple[str, dict]]]]:
    out = []
    for key, cb in app.callback_map.items():
        if "callback" in cb:  # clientside callbacks never reach the server
            deps = [("inputs", d) for d in cb["inputs"]] + [("state", d) for d in cb["state"]]
            out.append((key, deps))
    return out


def _body(key: str, deps: list, values: dict[str, Any], hostile: dict[int, Any]) -> dict:
    body: dict[str, Any] = {"output": key, "outputs": _outputs(key), "inputs": [], "state": []}
    for i, (where, dep) in enumerate(deps):
        prop_id = f"{dep['id']}.{dep['property']}"
        value = hostile[i] if i in hostile else values.get(prop_id)
        body[where].append({"id": _id(dep["id"]), "property": dep["property"], "value": value})
    body["changedPropIds"] = [f"{deps[i][1]['id']}.{deps[i][1]['property']}" for i in hostile]
    return body


def _post(client, body: Any) -> Any:
    return client.post(UPDATE, data=json.dumps(body), content_type="application/json")


def test_every_callback_answers_hostile_values_without_a_server_error(app, valid_values, caplog):
    """Each server callback (the pages', the shared helpers' and Dash's page router), with one
    input at a time and then all of them set to each value the UI never sends."""
    client = app.server.test_client()
    callbacks = _server_callbacks(app)
    assert len(callbacks) >= 20
    failures = []
    with caplog.at_level(logging.WARNING):
        for key, deps in callbacks:
            cases = [{i: v} for i in range(len(deps)) for v in HOSTILE]
            cases += [dict.fromkeys(range(len(deps)), v) for v in HOSTILE]
            for hostile in cases:
                response = _post(client, _body(key, deps, valid_values, hostile))
                if response.status_code not in (200, 204):
                    failures.append((key[:50], hostile, response.status_code))
    assert not failures, failures[:10]
    # none needed the guard's last line of defence: each was a refused input or a page message
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[-3000:]
    assert "Traceback" not in caplog.text


def test_a_refused_value_is_answered_with_the_pages_message(app, valid_values):
    key = next(k for k, _ in _server_callbacks(app) if "attn-grid" in k and "attn-msg" in k)
    deps = dict(_server_callbacks(app))[key]
    layer = next(i for i, (_, d) in enumerate(deps) if d["id"] == "attn-layer")
    response = _post(app.server.test_client(), _body(key, deps, valid_values, {layer: "abc"}))
    assert response.status_code == 200
    shown = response.get_json()["response"]
    assert "attn-layer.value" in shown["attn-msg"]["children"]
    assert "reload the page" in shown["attn-msg"]["children"]
    assert shown["attn-msg"]["style"] == {"display": "block"}
    figure = shown[stringify_id({"type": "graph", "name": "attn-grid"})]["figure"]
    assert "attn-layer.value" in json.dumps(figure)
    # the same callback with the values the UI sends draws the grid and hides the message
    response = _post(app.server.test_client(), _body(key, deps, valid_values, {}))
    assert response.get_json()["response"]["attn-msg"]["style"] == {"display": "none"}


def test_request_bodies_are_capped_before_they_are_read(app, valid_values):
    key = next(k for k, _ in _server_callbacks(app) if k == "attn-applied.data")
    deps = dict(_server_callbacks(app))[key]
    client = app.server.test_client()
    big = _body(key, deps, valid_values, {1: "y" * (2 * http_hardening.MAX_REQUEST_BYTES)})
    assert _post(client, big).status_code == 413
    under = _body(key, deps, valid_values, {1: "y" * (http_hardening.MAX_REQUEST_BYTES - 4096)})
    response = _post(client, under)  # under the cap: read, then refused by the prompt's kind
    assert response.status_code in (200, 204)
    assert "attn-applied" not in response.get_data(as_text=True)  # the store was left as it was


GOOD_OUTPUT = '{"name":"sim-residual","type":"graph"}.figure'
MALFORMED = [
    "null",
    "[]",
    "{}",
    json.dumps({"output": "nope"}),
    json.dumps({"output": GOOD_OUTPUT, "inputs": []}),
    json.dumps({"output": GOOD_OUTPUT, "inputs": "abc"}),
    json.dumps({"output": GOOD_OUTPUT, "inputs": [{"id": "sim-value"}]}),
    json.dumps(
        {"output": GOOD_OUTPUT, "inputs": [{"id": "sim-value", "property": "value", "value": "x"}]}
    ),
    "not json",
]


@pytest.mark.parametrize("data", MALFORMED)
def test_malformed_requests_get_400_without_a_traceback(app, data, caplog):
    response = app.server.test_client().post(UPDATE, data=data, content_type="application/json")
    assert response.status_code == 400
    assert "Traceback" not in caplog.text and not any(
        r.levelno >= logging.ERROR for r in caplog.records
    )


def test_every_page_control_has_a_declared_kind(app):
    """A page's `value`/`data` inputs are declared in its INPUTS (other properties have kinds
    by property), so a new control cannot skip the check by accident."""
    undeclared = sorted(
        f"{dep['id']}.{dep['property']}"
        for _, deps in _server_callbacks(app)
        for _, dep in deps
        if dep["property"] in ("value", "data")
        and not dep["id"].startswith("_")
        and f"{dep['id']}.{dep['property']}" not in app.kinds
    )
    assert undeclared == [], undeclared


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
KINDS = {  # by name, in a fixed order
    kind.name: kind
    for kind in [
        *value_kinds.BY_PROPERTY.values(),
        *(value_kinds.NAME, value_kinds.PROMPT, value_kinds.INDEX, value_kinds.NUMBER),
        *(value_kinds.FLAGS, value_kinds.CLICK),
    ]
}


@settings(max_examples=300, deadline=None)
@given(value=JSON, kind=st.sampled_from(list(KINDS.values())))
def test_a_kind_accepts_or_refuses_any_json_value_in_one_message(value, kind):
    try:
        kind.check("x.value", value)
    except CallbackInputError as exc:
        assert "\n" not in str(exc) and "x.value" in str(exc)


# ----- concurrent clients ---------------------------------------------------------------------
def _in_thread(fn, *args) -> threading.Thread:
    thread = threading.Thread(target=fn, args=args, daemon=True)
    thread.start()
    return thread


def test_one_key_is_computed_once_and_a_hit_never_waits_for_another_key():
    cache, release, calls = LRU(), threading.Event(), []

    def slow():
        calls.append(1)
        release.wait(60)
        return "slow"

    cache.get_or_compute("cached", lambda: "hit")
    waiters = [_in_thread(cache.get_or_compute, "slow", slow) for _ in range(4)]
    hit = _in_thread(cache.get_or_compute, "cached", lambda: "recomputed")
    hit.join(30)
    assert not hit.is_alive(), "a cache hit waited for another key's computation"
    release.set()
    for thread in waiters:
        thread.join(30)
    assert len(calls) == 1 and cache.get_or_compute("slow", slow) == "slow"


def test_one_model_busy_does_not_block_the_other(wb):
    """While one model is held by a forward pass, the other model runs a new prompt."""
    busy, done = threading.Event(), threading.Event()

    def hold():
        with wb.registry.using("smelt"):
            busy.set()
            done.wait(60)

    holder = _in_thread(hold)
    assert busy.wait(30)
    other = _in_thread(cached_run, wb, "baseline", "a prompt nobody ran before")
    other.join(60)
    still_waiting = other.is_alive()
    done.set()
    holder.join(30)
    assert not still_waiting, "the baseline waited for the smelt model's lock"


def test_torch_threads_default_to_the_cores_divided_among_the_models(monkeypatch):
    """At most one forward pass per model runs at once, so each gets its share of the cores."""
    from smelt_interp.app.__main__ import default_threads

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert [default_threads(n) for n in (1, 2, 3, 16)] == [8, 4, 2, 1]


@pytest.fixture
def live_server(app) -> Iterator[str]:
    """The app served by a threaded server on 127.0.0.1 in this process."""
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app.server, threaded=True)
    thread = _in_thread(server.serve_forever)
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(30)


def test_concurrent_clients_are_all_answered(app, wb, valid_values, live_server):
    """4 clients x 5 Dyck requests (a few distinct prompts, so some are computed and some
    cached) on the loopback server: bounded in count and time, loose on errors, none on time."""
    key = next(k for k, _ in _server_callbacks(app) if "dyck-results" in k)
    deps = dict(_server_callbacks(app))[key]
    prompts = [generate_dyck(2, 2, 1, seed, shortest_context(wb)) for seed in range(6)]
    statuses: list[Any] = []

    def client(c: int) -> None:
        for r in range(5):
            body = _body(key, deps, valid_values, {0: prompts[(c + r) % len(prompts)]})
            request = urllib.request.Request(
                live_server + UPDATE,
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=120) as resp:
                    ok = "dyck-results" in json.loads(resp.read())["response"]
                    statuses.append(resp.status if ok else "no results")
            except urllib.error.HTTPError as exc:
                statuses.append(exc.code)
            except OSError as exc:  # a timeout on a very slow machine: counted, not fatal
                statuses.append(type(exc).__name__)

    threads = [_in_thread(client, c) for c in range(4)]
    for thread in threads:
        thread.join(300)
    assert not any(t.is_alive() for t in threads), "clients still waiting after 300 s"
    assert len(statuses) == 20
    assert not [s for s in statuses if isinstance(s, int) and s >= 500], statuses
    assert statuses.count(200) >= 16, statuses


# ----- every request gets a status, never a 500 ----------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "/_dash-component-suites/nope/x.js",
        "/_dash-component-suites/dash/nope.js",
        "/_dash-component-suites/dash/deps/react@0.0.1.min.js",
        "/_dash-component-suites/plotly/package_data/../../../etc/passwd",
        "/_dash-component-suites/dash/dcc/dash_core_components.v9_9_9m1.js.map.x",
    ],
)
def test_a_component_file_dash_does_not_serve_is_404(app, path, caplog):
    response = app.server.test_client().get(path)
    assert response.status_code == 404
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[-2000:]


def _deep(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def _real_body(app, valid_values) -> dict:
    key = next(k for k, _ in _server_callbacks(app) if k == "attn-applied.data")
    return _body(key, dict(_server_callbacks(app))[key], valid_values, {})


@pytest.mark.parametrize("where", ["output", "an input value", "outputs", "the whole body"])
@pytest.mark.parametrize("depth", [1_000, 50_000])
def test_a_deeply_nested_body_is_400_without_recursion(app, valid_values, where, depth, caplog):
    body = _real_body(app, valid_values)
    if where == "output":
        body["output"] = "DEEP"
    elif where == "an input value":
        body["inputs"][0]["value"] = "DEEP"
    elif where == "outputs":
        body["outputs"] = "DEEP"
    else:
        body = "DEEP"
    data = json.dumps(body).replace('"DEEP"', _deep(depth))
    assert len(data) < http_hardening.MAX_REQUEST_BYTES
    response = app.server.test_client().post(UPDATE, data=data, content_type="application/json")
    assert response.status_code == 400
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[-2000:]


def _with(body: dict, **changes: Any) -> dict:
    return {**body, **changes}


@pytest.mark.parametrize(
    "change",
    [
        {"outputs": {"id": "no-such-store", "property": "data"}},
        {"outputs": {"id": "attn-applied", "property": "children"}},
        {"outputs": {"id": {"type": "graph", "name": "attn-applied"}, "property": "data"}},
        {"outputs": [{"id": "attn-applied", "property": "data"}] * 2},
        {"changedPropIds": [1]},
        {"changedPropIds": [{"a": 2}]},
        {"changedPropIds": "attn-run.n_clicks"},
        {"changedPropIds": [None, "attn-run.n_clicks"]},
        {"changedPropIds": ["x" * 10_000]},
    ],
)
def test_a_well_shaped_body_that_is_not_the_callbacks_is_400(app, valid_values, change, caplog):
    body = _with(_real_body(app, valid_values), **change)
    response = _post(app.server.test_client(), body)
    assert response.status_code == 400
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[-2000:]


def test_wildcard_outputs_must_name_the_callbacks_components(app, valid_values):
    key = next(k for k, _ in _server_callbacks(app) if '"type":"nav"' in k)
    deps = dict(_server_callbacks(app))[key]
    good = _body(key, deps, valid_values, {})
    assert _post(app.server.test_client(), good).status_code == 200
    renamed = [[{**spec, "id": {"type": "other", "path": "/"}} for spec in good["outputs"][0]]]
    for outputs in (
        renamed + good["outputs"][1:],
        [[{**spec, "id": {**spec["id"], "extra": 1}} for spec in good["outputs"][0]]]
        + good["outputs"][1:],
        [[{**spec, "id": {**spec["id"], "path": {"a": 1}}} for spec in good["outputs"][0]]]
        + good["outputs"][1:],
    ):
        assert _post(app.server.test_client(), {**good, "outputs": outputs}).status_code == 400


# ----- the Host header: DNS rebinding --------------------------------------------------------
@pytest.mark.parametrize(
    "host",
    [
        "evil.example.com",
        "evil.example.com:8050",
        "127.0.0.1.evil.example.com",
        "localhost.evil.example.com",
        "[::2]:8050",
        "10.0.0.1",
        "",
    ],
)
def test_a_request_for_another_host_is_refused(app, host):
    response = app.server.test_client().get("/", headers={"Host": host})
    assert response.status_code == 403
    assert "own address" in response.get_data(as_text=True)


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST:8050", "127.0.0.1", "127.0.0.1:8050", "[::1]:8050", "[::1]"]
)
def test_loopback_hosts_are_answered(app, host):
    assert app.server.test_client().get("/", headers={"Host": host}).status_code == 200


def test_the_bound_host_is_answered_as_well(wb, monkeypatch):
    import dash

    monkeypatch.setattr(dash.Dash, "run", lambda self, *a, **k: None)  # no server: the hosts
    named = create_app(wb)
    named.run(host="workbench.lan", port=1)
    client = named.server.test_client()
    assert client.get("/", headers={"Host": "workbench.lan:1"}).status_code == 200
    assert client.get("/", headers={"Host": "10.1.2.3:1"}).status_code == 403
    everywhere = create_app(wb)
    everywhere.run(host="0.0.0.0", port=1)  # every address: an IP literal is this server's own
    client = everywhere.server.test_client()
    assert client.get("/", headers={"Host": "10.1.2.3:1"}).status_code == 200
    assert client.get("/", headers={"Host": "evil.example.com"}).status_code == 403
    create_app(wb)  # the module's app is registered last again (Dash keeps one page registry)


# ----- what one attention response carries ---------------------------------------------------
@pytest.fixture(scope="module")
def long_wb():
    from conftest import TINY_FIELDS

    from smelt_interp.config import ModelConfig
    from smelt_interp.model.transformer import SmeltModel

    torch.manual_seed(0)
    model = SmeltModel(ModelConfig.smelt(**{**TINY_FIELDS, "max_seq_len": 4096})).eval()
    return Served(ModelRegistry.from_models({"smelt": model}))


def _block_means(pattern: np.ndarray, side: int) -> np.ndarray:
    """The reference: each cell the mean of its block of the whole pattern, by loops."""
    edges = pattern_cap.block_edges(pattern.shape[-1], side)
    out = np.zeros((pattern.shape[0], len(edges) - 1, len(edges) - 1))
    for i in range(len(edges) - 1):
        for j in range(len(edges) - 1):
            block = pattern[:, edges[i] : edges[i + 1], edges[j] : edges[j + 1]]
            out[:, i, j] = block.astype(np.float64).mean(axis=(1, 2))
    return out


@pytest.mark.parametrize("n_chars", [1_000, 3_000])
def test_a_long_prompts_attention_response_is_capped(long_wb, n_chars):
    from smelt_interp.app.pages import attention

    prompt = ("( [ { } ] ) " * n_chars)[:n_chars]
    focus, pair, info = attention.focus_figures(long_wb, "smelt", 1, 0, 0, False, prompt)
    grid, _, _ = attention.grid_figure(long_wb, "smelt", 1, 0, False, prompt)
    sizes = [len(fig.to_json()) for fig in (focus, pair, grid)]
    assert sum(sizes) < 16 * 2**20, sizes  # the whole pattern: 19 MB at 1,000 bytes, 170 at 3,000
    z = np.asarray(focus.data[0].z, dtype=float)
    assert z.shape == (pattern_cap.side_for(4),) * 2
    run = cached_run(long_wb, "smelt", prompt)
    exact = run.pattern(1, 0)  # [H, T, T]: the reference, computed whole
    side = pattern_cap.side_for(exact.shape[0])
    want = _block_means(exact, side)[0]
    upper = np.triu(np.ones_like(want, dtype=bool), k=1)
    assert np.allclose(
        np.where(upper, 0.0, np.nan_to_num(z)), np.where(upper, 0.0, want), atol=1e-6
    )
    shown = pattern_cap.capped(run).bos_share(1, 0)
    assert np.allclose(shown, run.bos_share(1, 0), atol=1e-6)
    assert f"{run.n_tokens} tokens" in info


def test_a_short_prompt_is_drawn_cell_for_cell(long_wb):
    from smelt_interp.app.pages import attention

    prompt = "( [ { } ] ) ( ) [ ]"
    focus, _, _ = attention.focus_figures(long_wb, "smelt", 1, 0, 2, False, prompt)
    exact = cached_run(long_wb, "smelt", prompt).pattern(1, 0)[2]
    z = np.asarray(focus.data[0].z, dtype=float)
    assert z.shape == exact.shape
    lower = np.tril(np.ones_like(exact, dtype=bool))
    assert np.allclose(z[lower], exact[lower])


def test_pooling_never_holds_the_whole_pattern(monkeypatch):
    """At 65,536 positions the whole pattern of 4 heads is 64 GiB; pooled, the weights held at
    once stay within CHUNK_CELLS (recorded from each computed chunk)."""
    largest = []
    real = pattern_cap.attention_rows

    def recorded(q, k, pos, n_keys, *args, **kwargs):
        largest.append(q.shape[2] * len(pos) * n_keys)
        return real(q, k, pos, n_keys, *args, **kwargs)

    monkeypatch.setattr(pattern_cap, "attention_rows", recorded)
    monkeypatch.setattr(pattern_cap, "CHUNK_CELLS", 1 << 14)
    q, k = torch.randn(1, 2_000, 4, 8), torch.randn(1, 2_000, 2, 8)
    pooled = pattern_cap.pooled_pattern(q, k, 64)
    assert pooled.shape == (4, 64, 64) and max(largest) <= 1 << 14
    widths = np.diff(pattern_cap.block_edges(2_000, 64))
    rows = (pooled * widths).sum(axis=-1)  # block means back to sums: each query's row is 1
    assert np.allclose(rows, 1.0, atol=1e-4)
