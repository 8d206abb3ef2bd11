"""One registration per probe: the built-in specs are complete and consistent, and a probe
written outside the package (one module, one `register` call) shows up in the report, with its
figure, without any other edit."""

from __future__ import annotations

import importlib
import json
import sys

import pandas as pd
import pytest

from smelt_interp import report
from smelt_interp.errors import ProbeError
from smelt_interp.figures.probes import RENDERERS, probe_figures, render
from smelt_interp.probes import registry
from smelt_interp.probes.registry import BUILTIN, FigureSpec, get, registered


def test_builtin_probes_come_first_in_order():
    assert tuple(spec.name for spec in registered()[: len(BUILTIN)]) == BUILTIN
    with pytest.raises(ProbeError, match="unknown probe 'nope'.*sink"):
        get("nope")


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_spec_is_consistent(name):
    spec = get(name)
    assert spec.tables and spec.figures and spec.description
    for figure in spec.figures:
        assert figure.kind in RENDERERS and figure.table in spec.tables


def test_a_probe_registers_once():
    spec = registry.ProbeSpec("twice", "", lambda *a: {}, lambda t: pd.DataFrame(), ("t",))
    registry.register(spec)
    try:
        with pytest.raises(ProbeError, match="already registered"):
            registry.register(spec)
        with pytest.raises(ProbeError, match="already registered"):
            registry.register(registry.ProbeSpec("sink", "", spec.run, spec.summarize, ("t",)))
        assert registered()[-1] is spec
    finally:
        registry.unregister("twice")
    assert "twice" not in {s.name for s in registered()}
    with pytest.raises(ProbeError, match="no registered probe"):
        registry.unregister("sink")


def _depth_table(values: list[float]) -> pd.DataFrame:
    sched = [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (3, 0)]
    return pd.DataFrame(
        {
            "layer": [layer for layer, _ in sched],
            "visit": [visit for _, visit in sched],
            "depth": range(len(sched)),
            "score": values,
        }
    )


def test_by_depth_draws_any_column_per_model_and_visit():
    figure = FigureSpec("by_depth", "t", "Score by depth", y="score")
    flat = _depth_table([1.0] * 6).query("visit == 0").assign(depth=range(4))
    [fig] = render(figure, {"smelt": {"t": _depth_table([0.5] * 6)}, "baseline": {"t": flat}})
    assert [t.name for t in fig.data] == [
        "smelt · visit 0",
        "smelt · visit 1",
        "baseline · visit 0",
    ]
    assert fig.layout.yaxis.title.text == "score" and fig.layout.title.text == "Score by depth"
    per_model = FigureSpec("by_depth", "t", "score", y="score", per_model=True)
    titles = [f.layout.title.text for f in render(per_model, {"a": {"t": flat}, "b": {"t": flat}})]
    assert titles == ["a: score", "b: score"]
    with pytest.raises(ValueError, match="no renderer 'nope'"):
        render(FigureSpec("nope", "t", ""), {"a": {"t": flat}})


TOY_PROBE = '''
"""A toy probe: the mean residual norm after each (layer, visit)."""

import pandas as pd

from smelt_interp.model.protocol import hook_name
from smelt_interp.measure.batching import capture, make_batch
from smelt_interp.probes.common import depth_index
from smelt_interp.probes.registry import FigureSpec, ProbeSpec, register, summary


def run(model, inputs, opts):
    batch = make_batch(model, *inputs.batch())
    names = [hook_name(layer, visit, "hook_resid_post") for layer, visit in model.schedule]
    _, cache = capture(model, batch.tokens, names)
    depth = depth_index(model)
    rows = [
        {
            "layer": layer,
            "visit": visit,
            "depth": depth[layer, visit],
            "resid_norm": float(cache[name][batch.valid].norm(dim=-1).mean()),
        }
        for (layer, visit), name in zip(model.schedule, names)
    ]
    return {"norms": pd.DataFrame(rows)}


def summarize(tables):
    return summary([("mean residual norm", tables["norms"]["resid_norm"].mean(), "")])


PROBE = register(
    ProbeSpec(
        "toy",
        "Mean residual norm by effective depth.",
        run,
        summarize,
        tables=("norms",),
        figures=(FigureSpec("by_depth", "norms", "Toy: residual norm by depth", y="resid_norm"),),
    )
)
'''


@pytest.fixture
def toy_probe(tmp_path, monkeypatch):
    """The module above, imported from a folder outside the package (registering it)."""
    (tmp_path / "toy_probe.py").write_text(TOY_PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("toy_probe")
    yield module
    registry.unregister("toy")
    sys.modules.pop("toy_probe", None)


def test_a_registered_probe_appears_in_the_report(toy_probe, tiny_pair, tmp_path, capsys):
    assert registered()[-1] is toy_probe.PROBE and get("toy") is toy_probe.PROBE
    js, page = tmp_path / "r.json", tmp_path / "r.html"
    argv = [str(tiny_pair["smelt"]), "--compare", str(tiny_pair["baseline"])]
    argv += ["--n-seqs", "2", "--seq-len", "32", "--demos", "0", "--json", str(js)]
    assert report.main([*argv, "--html", str(page)]) == 0
    assert "== toy ==" in capsys.readouterr().out
    toy = json.loads(js.read_text())["probes"]["toy"]
    assert toy["summary"][0]["statistic"] == "mean residual norm"
    assert {row["model"] for row in toy["tables"]["norms"]} == {"smelt", "baseline"}
    text = page.read_text()
    assert "<h2>toy</h2>" in text and "Toy: residual norm by depth" in text
    tables = {"smelt": {"norms": pd.DataFrame(toy["tables"]["norms"]).drop(columns="model")}}
    [fig] = probe_figures(toy_probe.PROBE, tables)
    assert fig.layout.title.text == "Toy: residual norm by depth"


def test_every_builtin_probe_has_a_home_on_the_dashboard():
    """Page membership is the app's: each built-in probe is drawn by the pages that name it
    in PROBES, or is left to the report (REPORT_ONLY); none is shown twice."""
    from smelt_interp.app.pages import PAGES, REPORT_ONLY

    named = [name for page in PAGES for name in page.PROBES]
    assert sorted(named + list(REPORT_ONLY)) == sorted(BUILTIN)
    assert not hasattr(get("case_study"), "page")


def test_a_registered_probe_no_page_names_appears_on_the_overview(toy_probe, tiny_pair):
    """The toy probe, which no page names, gets a card on the Overview with its figure, served
    through the app's own callback; the other pages get no extra card."""
    from dash import page_registry

    from smelt_interp.app.pages import overview, probe_section, similarity
    from smelt_interp.app.registry import ModelRegistry
    from smelt_interp.app.served import Served
    from smelt_interp.app.server import create_app

    wb = Served(ModelRegistry({"smelt": tiny_pair["smelt"], "baseline": tiny_pair["baseline"]}))
    app = create_app(wb)
    assert [s.name for s in probe_section.specs_for(overview)] == ["toy"]
    assert probe_section.specs_for(similarity) == []
    layout = next(p for p in page_registry.values() if p["path"] == "/")["layout"]()
    section_id = {"type": probe_section.SECTION, "probe": "toy"}
    assert section_id in [getattr(c, "id", None) for c in layout._traverse()]
    output = next(key for key in app.callback_map if probe_section.SECTION in key)
    body = {
        "output": output,
        "outputs": {"id": section_id, "property": "children"},
        "inputs": [{"id": section_id, "property": "id", "value": section_id}],
        "changedPropIds": [],
        "state": [],
    }
    response = app.server.test_client().post("/_dash-update-component", json=body)
    assert response.status_code == 200, response.get_data(as_text=True)[:300]
    graphs = response.get_json()["response"][
        json.dumps(section_id, separators=(",", ":"), sort_keys=True)
    ]
    figures = graphs["children"]
    assert len(figures) == 1
    figure = figures[0]["props"]["figure"]
    assert figure["layout"]["title"]["text"] == "Toy: residual norm by depth"
    assert {trace["name"].split(" · ")[0] for trace in figure["data"]} == {"smelt", "baseline"}
