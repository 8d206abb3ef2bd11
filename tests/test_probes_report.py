"""The report over a Baseline/SMELT pair (`python -m smelt_interp.report`), and the dashboard's
figure functions it draws each probe's figures with (through smelt_interp.figures.probes)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from smelt_interp import report
from smelt_interp.figures import dyck as dyck_figs
from smelt_interp.figures import loop as loop_figs
from smelt_interp.figures.probes import probe_figures
from smelt_interp.measure.case_heads import answer_mass
from smelt_interp.probes.registry import get
from smelt_interp.probes.session import stack_models


def test_report_on_a_pair_writes_json_and_self_contained_html(tiny_pair, tmp_path, capsys):
    js, page = tmp_path / "r.json", tmp_path / "r.html"
    code = report.main(
        [
            str(tiny_pair["smelt"]),
            "--compare",
            str(tiny_pair["baseline"]),
            "--n-seqs",
            "2",
            "--seq-len",
            "48",
            "--demos",
            "0,1",
            "--json",
            str(js),
            "--html",
            str(page),
        ]
    )
    assert code == 0
    data = json.loads(js.read_text())
    assert set(data["probes"]) == {
        "sink",
        "routing",
        "similarity",
        "residual",
        "case_study",
        "lens",
        "dla",
        "head_ablation",
        "patching",
        "linear_probe",
    }
    assert {r["model"] for r in data["probes"]["patching"]["tables"]["heads"]} == {
        "smelt",
        "baseline",
    }
    probed = data["probes"]["linear_probe"]["tables"]["probes"]  # computed-recall rows, any pair
    assert {r["model"] for r in probed} == {"smelt", "baseline"}
    assert {r["feature"] for r in probed} == {"class"}
    assert "not looped" in data["probes"]["routing"]["skipped"]["baseline"]
    skipped = data["probes"]["head_ablation"]["skipped"]  # a Dyck pair: no recall rows to ablate
    assert set(skipped) == {"smelt", "baseline"} and "associative-recall" in skipped["smelt"]
    assert {r["model"] for r in data["probes"]["sink"]["tables"]["heads"]} == {"smelt", "baseline"}
    lens_rows = data["probes"]["lens"]["tables"]["depths"]
    assert {"ce", "dyck_exact", "loop_boundary"} <= set(lens_rows[0])
    text = page.read_text()
    assert "<script src=" not in text  # nothing fetched from a CDN
    assert text.count("Plotly.newPlot") >= 7 and "2-3 of 8" in text
    assert "<h2>sink over training</h2>" in text and "Attention sink over training" in text
    assert "case study over training" not in text  # a Dyck pair has no case-study evaluations
    assert "skipped" in capsys.readouterr().out


def test_report_on_a_recall_run_draws_the_case_study_over_training(tmp_path):
    from smelt_interp.train.config import TrainConfig
    from smelt_interp.train.presets import get_preset
    from smelt_interp.train.trainer import Trainer

    cfg = TrainConfig.from_dict({**get_preset("recall-pair-tiny"), "steps": 40, "threads": 1})
    Trainer(cfg, tmp_path / "baseline", progress=False).run()
    page, data = tmp_path / "r.html", tmp_path / "r.json"
    argv = [str(tmp_path / "baseline" / "ckpt.pt"), "--n-seqs", "2", "--seq-len", "48"]
    argv += ["--json", str(data)]
    assert report.main([*argv, "--demos", "0,1", "--html", str(page)]) == 0
    assert data.exists()
    text = page.read_text()
    assert "<h2>case study over training</h2>" in text and "Case study over training" in text


def _visit_frame(values: dict[str, list[float]]) -> pd.DataFrame:
    sched = [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (3, 0)]
    base = pd.DataFrame(
        {"layer": [l for l, _ in sched], "visit": [v for _, v in sched], "depth": range(len(sched))}
    )
    return base.assign(**values)


def test_tables_of_several_models_stack_with_a_model_column():
    smelt = _visit_frame({"cos_q": [0.9] * 6, "ctrl_cos_q": [0.3] * 6})
    base = pd.DataFrame(
        {"layer": [0, 1], "visit": [0, 0], "depth": [0, 1], "ctrl_cos_q": [0.2, 0.4]}
    )
    stacked = stack_models({"smelt": {"heads": smelt}, "baseline": {"heads": base}})["heads"]
    assert list(stacked.columns[:1]) == ["model"] and list(stacked["model"].unique()) == [
        "smelt",
        "baseline",
    ]
    assert stacked.loc[stacked["model"] == "baseline", "cos_q"].isna().all()


def test_dyck_figures_average_the_prompts_with_demonstrations():
    dy = pd.concat(
        [
            _visit_frame({"n_demos": n, "bos_mass": m, "demo_mass": 0.2})
            for n, m in ((0, 0.9), (1, 0.1), (2, 0.3))
        ]
    )
    mass = answer_mass(dy)
    assert (
        len(mass) == 6
        and list(mass["depth"]) == list(range(6))
        and np.allclose(mass["bos_mass"], 0.2)
    )
    assert np.allclose(answer_mass(dy[dy["n_demos"] == 0])["bos_mass"], 0.9)


def test_figures_have_one_trace_per_model_and_visit():
    one = _visit_frame({"sink_mass": np.linspace(0, 1, 6)})
    flat = one[one["visit"] == 0].assign(depth=range(4))
    assert len(loop_figs.sink_by_depth({"smelt": one}).data) == 2
    assert len(loop_figs.sink_by_depth({"smelt": one, "baseline": flat}).data) == 3
    lens = one.assign(
        ce=3.0, dyck_exact=0.5, loop_boundary=[False, False, True, False, True, False]
    )
    fig = loop_figs.lens_ce({"smelt": lens, "baseline": flat.assign(ce=3.5, dyck_exact=0.4)})
    assert len(fig.data) == 2 * 3 and {t.name for t in fig.data} == {
        "smelt · visit 0",
        "smelt · visit 1",
        "baseline · visit 0",
    }
    assert len(fig.layout.shapes) == 2  # the second pass shaded in both panels
    assert len(loop_figs.lens_ce({"smelt": lens.drop(columns="dyck_exact")}).data) == 2
    mass = one.assign(bos_mass=0.1, demo_mass=0.2)
    assert len(dyck_figs.mass_by_depth({"smelt": mass}).data) == 2 * 2


def test_report_figures_come_from_the_dashboards_functions(monkeypatch):
    calls = []
    for module, name in [
        (loop_figs, "sink_by_depth"),
        (loop_figs, "lens_ce"),
        (dyck_figs, "mass_by_depth"),
        (dyck_figs, "paper_comparison"),
    ]:
        monkeypatch.setattr(
            module,
            name,
            lambda frames, *, title=None, name=name: calls.append((name, list(frames), title)),
        )
    one = _visit_frame(
        {
            "sink_mass": 0.5,
            "share_sink_heads_64": 0.25,
            "ce": 3.0,
            "n_demos": 1,
            "bos_mass": 0.1,
            "demo_mass": 0.2,
        }
    )
    pair = {"smelt": one, "baseline": one}
    probe_figures(get("sink"), {label: {"visits": t} for label, t in pair.items()})
    probe_figures(get("lens"), {label: {"depths": t} for label, t in pair.items()})
    probe_figures(get("case_study"), {label: {"visits": t} for label, t in pair.items()})
    assert [c[0] for c in calls] == [
        "sink_by_depth",
        "lens_ce",
        "mass_by_depth",
        "paper_comparison",
    ]
    assert all(models == ["smelt", "baseline"] for _, models, _ in calls)
    assert calls[0][2] == "Attention-sink mass by effective depth"


def test_per_model_figures_are_titled_by_model():
    usage = pd.DataFrame(
        {"layer": [0, 0], "visit": [0, 0], "depth": [0, 0], "expert": [0, 1], "share": [0.5, 0.5]}
    )
    overlap = pd.DataFrame(
        {"layer": [1], "visit": [0], "other_visit": [1], "top_k": [2], "n_experts": [4]}
    ).assign(overlap=1.0, chance=1.0)
    tables = {"overlap": overlap, "usage": usage}
    figs = probe_figures(get("routing"), {"smelt": tables, "other": tables})
    titles = [f.layout.title.text for f in figs]
    assert titles == [
        "Experts shared by the two visits (dash: chance from the visits' expert usage)",
        "smelt: expert usage per visit",
        "other: expert usage per visit",
    ]
    assert probe_figures(get("routing"), {}) == []  # applied to no model: nothing to draw
