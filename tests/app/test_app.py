"""The dashboard's pure parts, without a browser: URL state, the per-prompt cache, prompt
error messages, checkpoint discovery and the CLI's one-line errors, page layouts and figures."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import plotly.graph_objects as go
import pytest

from smelt_interp.app.__main__ import main as app_main
from smelt_interp.app.default_prompts import default_prompt_for
from smelt_interp.app.pages import attention, case_study, routing
from smelt_interp.app.pages.case_study import dyck as case_dyck
from smelt_interp.app.pages.case_study.dyck import cached_case
from smelt_interp.app.probe_tables import model_tables
from smelt_interp.app.prompt_run import cached_run
from smelt_interp.app.registry import ModelRegistry, find_checkpoints
from smelt_interp.app.served import Served, shortest_context
from smelt_interp.app.urls import decode, decode_params, encode, merge
from smelt_interp.checkpoint import save_checkpoint
from smelt_interp.cli import run_cli
from smelt_interp.data import dyck_text
from smelt_interp.data.prompt_text import encode_prompt, prompt_error
from smelt_interp.errors import CheckpointError, PromptError
from smelt_interp.probes.inputs import ProbeRequest


@pytest.fixture
def pair(make_cfg, make_model):
    """Random-init tiny Baseline and SMELT (max_seq_len 128), already in memory."""
    return {
        "baseline": make_model(make_cfg(looped=False, max_seq_len=128)),
        "smelt": make_model(make_cfg(looped=True, max_seq_len=128), seed=1),
    }


@pytest.fixture
def wb(pair) -> Served:
    return Served(ModelRegistry.from_models(pair))


@pytest.fixture
def ckpt_dir(tmp_path, pair):
    for name, model in pair.items():
        save_checkpoint(tmp_path / "run" / name / "ckpt.pt", model)
    return tmp_path / "run"


# ----- URL state ----------------------------------------------------------------------------
def test_url_state_round_trip():
    state = {
        "model": "smelt",
        "layer": 2,
        "visit": 1,
        "head": 3,
        "bos": False,
        "prompt": "Input: ( [ Output: ] )\nsecond line & more = ünïcode ?#",
    }
    search = encode(attention.QUERY, state)
    assert search.startswith("?model=smelt&layer=2&visit=1&head=3&bos=0&prompt=")
    assert decode(attention.QUERY, search) == state
    assert encode(attention.QUERY, decode(attention.QUERY, search)) == search
    state = {"pairs": 3, "depth": 2, "demos": 1, "seed": 7, "dyck": "( [\n{"}
    assert decode(case_study.QUERY, encode(case_study.QUERY, state)) == state
    # Dash pages hands a page its query as keyword arguments, a repeated key as a list
    assert decode_params(routing.QUERY, {"token": ["1", "7"], "model": "smelt", "x": "1"}) == {
        "token": 7,
        "model": "smelt",
    }


def test_url_state_is_forgiving():
    query = attention.QUERY
    assert decode(query, "?layer=abc&visit=1&nonsense=3&bos=maybe") == {"visit": 1}
    assert decode(query, "") == {} and decode(query, None) == {} and encode(query, {}) == ""
    assert decode(query, "layer=1&layer=2") == {"layer": 2}
    assert decode(query, "?token=3&dyck=x") == {}  # other pages' keys
    merged = merge(query, "?model=smelt&head=2&prompt=x", {"head": 0, "prompt": None, "layer": 1})
    assert decode(query, merged) == {"model": "smelt", "head": 0, "layer": 1}
    assert merged == "?model=smelt&layer=1&head=0"


def test_each_page_writes_only_its_own_keys():
    search = merge(routing.QUERY, "?token=2&layer=1&model=smelt", {"token": 5})
    assert search == "?model=smelt&token=5&layer=1"  # the Attention page's layer survives
    search = merge(attention.QUERY, search, {"layer": 2, "model": "baseline"})
    assert search == "?model=baseline&layer=2&token=5"
    assert decode(routing.QUERY, search) == {"model": "baseline", "token": 5}
    assert merge(case_study.QUERY, "", {"seed": None}) == ""


# ----- prompts and the cache ----------------------------------------------------------------
def test_prompt_errors_are_messages():
    assert prompt_error("( [ {", 64) is None
    assert "empty" in prompt_error("   ", 64)
    assert "cannot encode" in prompt_error("bad \ud800 text", 64)
    long_message = prompt_error("x" * 80, 64)
    assert "81 tokens" in long_message and "at most 64" in long_message
    assert encode_prompt("ab", 64)[1:] == [97, 98]


def test_cache_reuses_one_forward_pass(wb):
    prompt = default_prompt_for(wb, "smelt")
    run = cached_run(wb, "smelt", prompt)
    assert (wb.prompts.misses, wb.prompts.hits) == (1, 0)
    assert cached_run(wb, "smelt", prompt) is run
    pat = run.pattern(1, 1)
    assert pat.shape == (wb.registry.cfg("smelt").n_heads, run.n_tokens, run.n_tokens)
    assert run.pattern(1, 1) is pat
    for head in range(2):
        for visit in (0, 1):
            out = attention.figures(wb, "smelt", 1, visit, head, True, prompt)
            assert out[4] == {"display": "none"}
    assert wb.prompts.misses == 1 and wb.prompts.hits >= 4
    cached_run(wb, "baseline", prompt)
    assert wb.prompts.misses == 2 and len(wb.prompts) == 2


def test_cache_is_bounded(pair):
    wb = Served(ModelRegistry.from_models(pair), cache_size=2)
    for text in ("a", "b", "c"):
        cached_run(wb, "smelt", text)
    version = wb.registry.version("smelt")
    assert len(wb.prompts) == 2 and ("smelt", version, "a") not in wb.prompts
    assert ("smelt", version, "c") in wb.prompts


def test_bad_prompt_shows_message_and_next_prompt_works(wb):
    with pytest.raises(PromptError):
        cached_run(wb, "smelt", "y" * 500)
    focus, grid, visits, msg, style, _ = attention.figures(wb, "smelt", 1, 1, 0, False, "y" * 500)
    assert "at most 128" in msg and style == {"display": "block"}
    assert isinstance(focus, go.Figure)
    focus, *_, msg, style, info = attention.figures(wb, "smelt", 1, 1, 0, False, "hello")
    assert msg == "" and style == {"display": "none"} and info.startswith("6 tokens")
    assert focus.data[0].z.shape == (6, 6)


# ----- pages and figures --------------------------------------------------------------------
def test_attention_defaults_pick_a_looped_layer_and_its_last_visit(wb):
    s = attention.resolve(wb, {})
    cfg = wb.registry.cfg("smelt")
    assert s["model"] == "smelt" and s["layer"] in cfg.looped_layers and s["visit"] == 1
    # the default head needs a forward pass: the layout leaves it to a callback
    assert s["head"] is None and len(wb.prompts) == 0
    head = attention.default_head(wb, "smelt", s["layer"], s["visit"], s["prompt"])
    assert head == cached_run(wb, "smelt", s["prompt"]).structured_head(s["layer"], s["visit"])
    s = attention.resolve(wb, {"model": "baseline", "layer": 3, "visit": 1, "head": 99})
    assert (s["model"], s["layer"], s["visit"], s["head"]) == ("baseline", 3, 0, None)
    assert attention.resolve(wb, {"model": "baseline", "head": 2})["head"] == 2


def test_every_page_lays_out_and_the_app_builds(wb):
    import dash

    from smelt_interp.app.pages import PAGES
    from smelt_interp.app.server import create_app

    app = create_app(wb)
    assert app.config.serve_locally
    paths = [p["path"] for p in dash.page_registry.values()]
    assert paths == [page.PATH for page in PAGES] + ["/404"]

    titles = set()
    for page in PAGES:
        # a bad URL state (unknown model, layer -1, an unencodable prompt) still lays out the page
        for state in ({}, {"model": "nope", "layer": -1, "prompt": "\ud800"}):
            found = [c.children for c in walk(page.layout(wb, state)) if type(c).__name__ == "H1"]
            assert len(found) == 1 and found[0], (page.PATH, found)
            titles.add(found[0])
    assert len(titles) == len(PAGES)


def walk(component):
    """A Dash component and every component under it (strings and numbers are not)."""
    if not hasattr(component, "to_plotly_json"):
        return
    yield component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        yield from walk(child)


def texts(component) -> list[str]:
    """Every string child in a Dash component tree."""
    out = []
    for c in walk(component):
        children = getattr(c, "children", None)
        children = children if isinstance(children, list) else [children]
        out += [child for child in children if isinstance(child, str)]
    return out


def test_pages_are_served_by_dash_pages_from_the_url(wb):
    import dash

    from smelt_interp.app.server import create_app

    create_app(wb)
    pages = {p["path"]: p for p in dash.page_registry.values()}
    # Dash calls a layout with the query parameters (a repeated key as a list) and the path
    layout = pages["/attention"]["layout"](
        model="baseline", layer=["1", "2"], head="x", pathname="/attention"
    )
    radios = {c.id: c.value for c in walk(layout) if type(c).__name__ == "RadioItems"}
    assert radios["attn-model"] == "baseline" and radios["attn-layer"] == 2
    missing = pages["/404"]["layout"](pathname="/nope", model="smelt")
    assert "There is no page at /nope." in texts(missing)


def test_styles_and_scripts_are_assets_found_from_any_folder(wb, tmp_path, monkeypatch):
    from smelt_interp.app.server import create_app

    monkeypatch.chdir(tmp_path)
    client = create_app(wb).server.test_client()
    page = client.get("/attention").get_data(as_text=True)
    assert "/assets/smelt.css" in page and "/assets/graph_config.js" in page
    css = client.get("/assets/smelt.css")
    assert css.status_code == 200 and b".topbar" in css.data
    js = client.get("/assets/graph_config.js")
    assert js.status_code == 200 and b"graphConfig" in js.data


def test_page_text_quotes_the_paper(wb):
    from smelt_interp import paper
    from smelt_interp.app.pages import similarity

    text = " ".join(texts(similarity.layout(wb, {})))
    assert f"Q/K {paper.COS_Q}, V {paper.COS_V}" in text
    assert f"top-8 {paper.TOP8_OVERLAP}, control {paper.TOP8_OVERLAP_CONTROL}" in text
    assert "finds 2-3 of k = 8 experts" in " ".join(texts(routing.layout(wb, {})))


def _budget_rows(page) -> dict[str, list[str]]:
    """The Overview's budget table: model name -> its row's cells."""
    tables = [c for c in walk(page) if type(c).__name__ == "Table"]
    budget = next(t for t in tables if "sparsity S" in texts(t.children[0]))
    header = texts(budget.children[0])
    rows = {}
    for tr in budget.children[1].children:
        cells = [td.children for td in tr.children]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def test_overview_shows_one_sparsity_for_a_matched_pair(make_cfg, make_model):
    """A Baseline and the SMELT the matcher gives for it show one S, the Baseline's, computed
    here from the counters (2 x non-embedding parameters + attention per physical layer); an
    unmatched pair (the `wb` fixture's: same shape, looped) shows each model's own."""
    from smelt_interp.app.pages import overview
    from smelt_interp.budget import flops_per_token, match_smelt, non_embedding_params

    base = make_cfg(looped=False, d_model=64, d_head=16, d_expert=64, max_seq_len=128)
    smelt = match_smelt(base, seq_len=128).smelt
    models = {"baseline": make_model(base), "smelt": make_model(smelt, seed=1)}
    page = overview.layout(Served(ModelRegistry.from_models(models)), {})
    rows = _budget_rows(page)
    attention = base.n_layers * 4 * base.n_heads * base.d_head * 128
    S = 1 - flops_per_token(base, 128) / (2 * non_embedding_params(base) + attention)
    assert rows["baseline"]["sparsity S"] == rows["smelt"]["sparsity S"] == f"{S:.1%}"
    text = " ".join(texts(page))
    assert f"Sparsity S = {S:.1%} for the pair" in text and "shares one S" in text

    twin = make_cfg(looped=True, d_model=64, d_head=16, d_expert=64, max_seq_len=128)
    models = {"baseline": make_model(base), "smelt": make_model(twin, seed=1)}
    page = overview.layout(Served(ModelRegistry.from_models(models)), {})
    rows = _budget_rows(page)
    assert rows["baseline"]["sparsity S"] == f"{S:.1%}" != rows["smelt"]["sparsity S"]
    assert "is each model's own" in " ".join(texts(page))


def test_probe_figures(wb):
    from smelt_interp.figures import loop

    sink = {n: model_tables(wb, "sink", n)["visits"] for n in wb.registry.names}
    assert len(loop.sink_by_depth(sink).data) == 3  # baseline v0, smelt v0, smelt v1
    assert model_tables(wb, "routing", "baseline") is None  # not looped: the probe does not apply
    overlap = model_tables(wb, "routing", "smelt")["overlap"]
    assert isinstance(loop.routing_overlap({"smelt": overlap}), go.Figure)
    heads = model_tables(wb, "similarity", "baseline")["heads"]
    assert isinstance(loop.qkv_similarity(heads, model="baseline"), go.Figure)
    writes = {n: model_tables(wb, "residual", n)["writes"] for n in wb.registry.names}
    assert isinstance(loop.residual_writes(writes), go.Figure)
    assert model_tables(wb, "sink", "smelt") is model_tables(wb, "sink", "smelt")
    cache = wb.table_cache
    assert cache.misses == len(cache) == 7  # each (probe, model) computed once


def test_dyck_case_study(wb):
    text = dyck_text.generate_dyck(3, 3, 2, 5, shortest_context(wb))
    query, demos = dyck_text.parse_dyck_lines(text)
    assert len(demos) == 2 and query
    assert dyck_text.parse_dyck_lines("Input: ( [ Output: ] )\n{") == ("{", ["( ["])
    panel, mass, paper, line, msg, style = case_dyck.results(wb, text)
    assert style == {"display": "none"} and len(line) == 3
    assert {c.model for c in (cached_case(wb, n, text) for n in wb.registry.names)} == {
        "baseline",
        "smelt",
    }
    *_, msg, style = case_dyck.results(wb, "( )")
    assert "balanced" in msg and style == {"display": "block"}


# ----- checkpoints and the command line ------------------------------------------------------
def test_find_checkpoints_names_models_by_folder(ckpt_dir):
    found = find_checkpoints([ckpt_dir])
    assert list(found) == ["baseline", "smelt"]
    assert find_checkpoints([ckpt_dir / "smelt" / "ckpt.pt"]) == {
        "smelt": ckpt_dir / "smelt" / "ckpt.pt"
    }
    reg = ModelRegistry(found)
    assert reg.names == ["baseline", "smelt"] and reg.pair() == ("baseline", "smelt")
    with pytest.raises(CheckpointError):
        find_checkpoints([ckpt_dir / "missing.pt"])
    (ckpt_dir / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no ckpt.pt"):
        find_checkpoints([ckpt_dir / "empty"])


@pytest.mark.parametrize("case", ["missing", "corrupt", "empty-folder", "bad-port"])
def test_cli_bad_input_is_one_line_exit_2(case, tmp_path, capsys):
    if case == "missing":
        argv = [str(tmp_path / "nope" / "ckpt.pt")]
    elif case == "corrupt":
        (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
        argv = [str(tmp_path / "ckpt.pt")]
    elif case == "empty-folder":
        argv = [str(tmp_path)]
    else:
        argv = [str(tmp_path), "--port", "notaport"]
    with pytest.raises(SystemExit) as exc:
        run_cli(app_main, argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error" in err


def test_default_pair_is_trained_only_when_missing_or_unfinished(tmp_path, pair, monkeypatch):
    import smelt_interp.train.trainer as pair_module
    from smelt_interp.app.registry import ensure_default_pair

    calls = []

    def fake_train(cfg, out_dir, *, archs, resume, progress):
        calls.append(tuple(archs))
        for arch in archs:
            save_checkpoint(
                out_dir / arch / "ckpt.pt", pair[arch], final=arch != "smelt" or len(calls) > 1
            )

    monkeypatch.setattr(pair_module, "train_pair", fake_train)
    paths = ensure_default_pair(tmp_path / "runs", progress=False)
    assert calls == [("baseline", "smelt")] and all(p.exists() for p in paths.values())
    ensure_default_pair(tmp_path / "runs", progress=False)  # smelt saved unfinished: resume it
    assert calls[-1] == ("smelt",)
    ensure_default_pair(tmp_path / "runs", progress=False)
    assert len(calls) == 2


def test_cli_port_in_use_is_one_line_exit_2(ckpt_dir, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(SystemExit) as exc:
            run_cli(app_main, [str(ckpt_dir), "--port", str(taken.getsockname()[1])])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot serve" in err


def test_dashboard_figure_and_report_table_are_the_same_numbers(pair, tmp_path):
    """The Overview's sink figure, served through the app's callback, draws the very values
    of the report's sink table for the same checkpoints and inputs (one road: spec.run)."""
    import json

    import pandas as pd

    from smelt_interp import report
    from smelt_interp.app.server import create_app

    paths = {n: save_checkpoint(tmp_path / n / f"{n}.pt", m) for n, m in pair.items()}
    argv = ["--n-seqs", "2", "--seq-len", "40", "--demos", "0,1", "--seed", "3"]
    js = tmp_path / "report.json"
    out = ["--json", str(js), "--html", str(tmp_path / "report.html")]
    assert report.main([str(paths["smelt"]), "--compare", str(paths["baseline"]), *argv, *out]) == 0
    visits = pd.DataFrame(json.loads(js.read_text())["probes"]["sink"]["tables"]["visits"])

    request = ProbeRequest(n_seqs=2, seq_len=40, demos=(0, 1), seed=3)  # the same as argv
    wb = Served(ModelRegistry(paths), probe_request=request)
    app = create_app(wb)
    graph = '{"name":"overview-sink","type":"graph"}'
    body = {
        "output": f"{graph}.figure",
        "outputs": {"id": json.loads(graph), "property": "figure"},
        "inputs": [{"id": "overview-load", "property": "data", "value": 0}],
        "changedPropIds": [],
        "state": [],
    }
    response = app.server.test_client().post("/_dash-update-component", json=body)
    assert response.status_code == 200, response.get_data(as_text=True)[:300]
    traces = response.get_json()["response"][graph]["figure"]["data"]
    drawn = {
        (t["name"], x): y
        for t in traces
        if " · visit " in t.get("name", "")
        for x, y in zip(t["x"], t["y"])
        if x is not None
    }
    expected = {(f"{r.model} · visit {r.visit}", r.depth): r.sink_mass for r in visits.itertuples()}
    assert set(drawn) == set(expected) and len(expected) == 4 + 6  # Baseline 4, SMELT 6 visits
    assert all(drawn[key] == pytest.approx(expected[key], abs=1e-9) for key in expected)
    # the inputs are the report's: a different seed gives different numbers
    other = Served(ModelRegistry(paths), probe_request=replace(request, seed=4))
    moved = model_tables(other, "sink", "smelt")["visits"]["sink_mass"].to_numpy()
    assert not np.allclose(moved, visits[visits.model == "smelt"]["sink_mass"].to_numpy())


def test_every_control_a_callback_reads_is_declared_once(wb):
    """Each page's CONTROLS is the one declaration: its QUERY and INPUTS are derived from it,
    and every value a callback reads is either a declared control's or has a kind by its
    property (clicks, the address bar) or is a pattern-matching id."""
    from dash._utils import stringify_id as dash_stringify_id

    from smelt_interp.app import value_kinds
    from smelt_interp.app.controls import stringify_id
    from smelt_interp.app.pages import PAGES
    from smelt_interp.app.server import create_app, input_kinds

    for page in PAGES:
        assert page.QUERY == {n: c.url for n, c in page.CONTROLS.items() if c.url}
        assert page.INPUTS == {f"{c.id}.{c.prop}": c.kind for c in page.CONTROLS.values()}
    assert list(attention.QUERY) == ["model", "layer", "visit", "head", "bos", "prompt"]
    assert attention.CONTROLS.inputs("layer")[0].component_id == "attn-layer"
    app = create_app(wb)
    declared = input_kinds()
    for callback in app.callback_map.values():
        for item in callback["inputs"] + callback["state"]:
            if item["id"].startswith(("{", "_pages")):  # a pattern-matching id, Dash's own
                continue
            prop_id = f"{item['id']}.{item['property']}"
            assert prop_id in declared or item["property"] in value_kinds.BY_PROPERTY, prop_id
    graph = {"type": "graph", "name": "attn-grid"}
    assert stringify_id(graph) == dash_stringify_id(graph) and stringify_id("x") == "x"


def test_a_dashboard_that_stops_leaves_the_signal_handlers_as_it_found_them(
    ckpt_dir, monkeypatch, capsys
):
    """The server ignores Ctrl-C while it stops its trainer; left ignored, every process this
    one starts later would inherit the ignored SIGINT and SIGTERM and could not be stopped."""
    import signal

    from smelt_interp.app import server
    from smelt_interp.errors import SmeltError

    def failing_app(workbench):
        raise SmeltError("stop here")

    import socket

    with socket.socket() as probe:  # a port free now (the app binds it only after create_app)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    monkeypatch.setattr(server, "create_app", failing_app)
    with pytest.raises(SystemExit) as exc:
        run_cli(app_main, [str(ckpt_dir), "--port", str(port)])
    assert exc.value.code == 2 and "stop here" in capsys.readouterr().err
    assert {sig: signal.getsignal(sig) for sig in before} == before
