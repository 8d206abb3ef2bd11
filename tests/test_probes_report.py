"""The report over a Baseline/SMELT pair, and the figure functions it shares with the dashboard."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from smelt_interp.figures import probes as figs
from smelt_interp.probes import report


def test_report_on_a_pair_writes_json_and_self_contained_html(tiny_pair, tmp_path, capsys):
    js, page = tmp_path / "r.json", tmp_path / "r.html"
    code = report.main([str(tiny_pair["smelt"]), "--compare", str(tiny_pair["baseline"]), "--n-seqs", "2",
                        "--seq-len", "48", "--demos", "0,1", "--json", str(js), "--html", str(page)])
    assert code == 0
    data = json.loads(js.read_text())
    assert set(data["probes"]) == {"sink", "routing", "similarity", "residual", "dyck", "lens"}
    assert "not looped" in data["probes"]["routing"]["skipped"]["baseline"]
    assert {r["model"] for r in data["probes"]["sink"]["tables"]["heads"]} == {"smelt", "baseline"}
    lens_rows = data["probes"]["lens"]["tables"]["depths"]
    assert {"ce", "dyck_exact", "loop_boundary"} <= set(lens_rows[0])
    text = page.read_text()
    assert "<script src=" not in text                      # nothing fetched from a CDN
    assert text.count("Plotly.newPlot") >= 7 and "2-3 of 8" in text
    assert "skipped" in capsys.readouterr().out


def _visit_frame(values: dict[str, list[float]]) -> pd.DataFrame:
    sched = [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (3, 0)]
    base = pd.DataFrame({"layer": [l for l, _ in sched], "visit": [v for _, v in sched], "depth": range(len(sched))})
    return base.assign(**values)


def test_figures_have_one_trace_per_model_and_series():
    one = _visit_frame({"sink_mass": np.linspace(0, 1, 6)})
    two = pd.concat([one.assign(model="smelt"), one.assign(model="baseline")])
    assert len(figs.sink_by_depth(one).data) == 1 and len(figs.sink_by_depth(two).data) == 2
    writes = pd.concat([one.assign(sublayer=s, relative=0.5, write_norm=1.0) for s in ("attn", "mlp")])
    assert len(figs.residual_norms(writes).data) == 2
    dy = pd.concat([one.assign(n_demos=n, bos_mass=0.1, demo_mass=0.2) for n in (0, 2)])
    fig = figs.dyck_mass(dy)
    assert len(fig.data) == 2 and list(fig.data[0].y) == [0.1] * 6
    lens = one.assign(ce=3.0, dyck_exact=0.5, loop_boundary=[False, False, True, False, True, False])
    assert len(figs.lens_ce(lens).data) == 2
    ov = pd.DataFrame({"layer": [1, 2], "overlap": [1.5, 1.2], "chance": [1.0, 1.0], "top_k": [2, 2]})
    assert len(figs.routing_overlap(ov).data) == 2
    sim = pd.DataFrame({c: [0.5, 0.6] for c in ["cos_q", "cos_k", "cos_v", "top8_overlap", "ctrl_cos_q",
                                                   "ctrl_cos_k", "ctrl_cos_v", "ctrl_top8_overlap"]})
    bars = figs.similarity_bars(sim)
    assert [t.name for t in bars.data] == ["visit 0 vs 1", "control l vs l+1"]
    assert figs.similarity_bars(sim.drop(columns=["cos_q", "cos_k", "cos_v", "top8_overlap"])).data[0].name == "control l vs l+1"


def test_pattern_figures_are_the_dashboards():
    from smelt_interp.figures import attention
    assert figs.head_grid is attention.head_grid and figs.pattern_heatmap is attention.head_heatmap
