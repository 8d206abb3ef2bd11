"""The case study's intervals, trend and visit comparison: percentile bootstrap over prompts
checked against scipy's bootstrap, and hand-made masses whose answers are known; the probe's
tables on a model and the dashboard's aggregate."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from smelt_interp.app.probe_tables import model_tables, probe_inputs
from smelt_interp.app.served import Served, sink_training
from smelt_interp.measure.case_heads import by_visit
from smelt_interp.measure.case_tables import case_study, dyck_heads
from smelt_interp.measure.group_masses import STATS, GroupMasses, dyck_masses
from smelt_interp.probes.inputs import ProbeRequest, dyck_prompts

SCHEDULE = [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (3, 0)]  # layers 1..2 looped


def masses(n: int, seed: int, heads: int = 2) -> GroupMasses:
    """n prompts with 3..12 answer positions, masses drawn per prompt."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(3, 13, n).astype(float)
    share = rng.uniform(0, 1, (n, len(SCHEDULE), heads, len(STATS)))
    return GroupMasses(share * counts[:, None, None, None], counts)


def scipy_interval(m: GroupMasses, fn) -> tuple[float, float]:
    """scipy's percentile bootstrap of fn(pooled head-mean masses [visits, 2]) over prompts."""

    def stat(idx):
        idx = idx.astype(int)
        return fn(m.sums[idx].mean(axis=2).sum(axis=0) / m.counts[idx].sum())

    res = stats.bootstrap(
        (np.arange(len(m.counts)),),
        stat,
        vectorized=False,
        n_resamples=4000,
        method="percentile",
        random_state=1,
    )
    return res.confidence_interval.low, res.confidence_interval.high


def test_intervals_agree_with_scipys_percentile_bootstrap():
    m = masses(40, seed=0)
    tables = case_study({2: m}, SCHEDULE, n_resamples=4000, seed=3)
    visits, diff, trend = tables["visits"], tables["visit_diff"], tables["trend"]
    pooled = m.sums.mean(axis=2).sum(axis=0) / m.counts.sum()  # [visits, 2]
    checks = [
        (visits.loc[3, ["bos_mass", "bos_mass_lo", "bos_mass_hi"]], lambda v: v[3, 0]),
        (visits.loc[5, ["demo_mass", "demo_mass_lo", "demo_mass_hi"]], lambda v: v[5, 1]),
        (
            diff.query("layer == 1 and statistic == 'bos_mass'").iloc[0][["diff", "lo", "hi"]],
            lambda v: v[3, 0] - v[1, 0],
        ),
        (
            trend.query("statistic == 'bos_mass'").iloc[0][["slope", "lo", "hi"]],
            lambda v: np.polyfit(np.arange(len(SCHEDULE)), v[:, 0], 1)[0],
        ),
    ]
    for (point, lo, hi), fn in checks:
        ref_lo, ref_hi = scipy_interval(m, fn)
        assert point == pytest.approx(fn(pooled), abs=1e-12)
        width = ref_hi - ref_lo
        assert width > 0
        assert lo == pytest.approx(ref_lo, abs=0.1 * width)
        assert hi == pytest.approx(ref_hi, abs=0.1 * width)
        assert lo < point < hi


def test_identical_prompts_give_a_zero_width_interval_and_the_known_trend():
    """Every prompt has BOS mass 0.1 + 0.05 * depth on both heads and demo mass 0.5 at visit 0,
    0.8 at visit 1: resampling cannot move anything, slope is 0.05, visit 1 - visit 0 is 0.3."""
    depth = np.arange(len(SCHEDULE))
    bos = 0.1 + 0.05 * depth
    demo = np.array([0.8 if visit else 0.5 for _, visit in SCHEDULE])
    rest = 1 - bos - demo
    one = np.stack([bos, demo, 0 * bos, 0 * bos, rest], axis=-1)[:, None, :].repeat(2, axis=1)
    counts = np.array([4.0, 7.0, 9.0])
    m = GroupMasses(one[None] * counts[:, None, None, None], counts)
    tables = case_study({0: m}, SCHEDULE, n_resamples=200)
    visits = tables["visits"]
    assert np.allclose(visits["bos_mass"], bos) and np.allclose(visits["demo_mass"], demo)
    for stat in STATS[: one.shape[-1]]:
        assert np.allclose(visits[f"{stat}_lo"], visits[stat])
        assert np.allclose(visits[f"{stat}_hi"], visits[stat])
    trend = tables["trend"].set_index("statistic")
    assert trend.loc["bos_mass", ["slope", "lo", "hi"]].tolist() == pytest.approx([0.05] * 3)
    diff = tables["visit_diff"]
    assert sorted(diff["layer"].unique()) == [1, 2]
    demo_diff = diff[diff["statistic"] == "demo_mass"]
    assert np.allclose(demo_diff[["diff", "lo", "hi"]], 0.3)
    assert np.allclose(diff.loc[diff["statistic"] == "bos_mass", "diff"], 0.05 * 2)


def test_a_baseline_has_no_visit_comparison_and_resampling_is_seeded():
    flat = [(layer, 0) for layer in range(4)]
    m = masses(10, seed=2)
    m = GroupMasses(m.sums[:, :4], m.counts)
    tables = case_study({1: m}, flat, n_resamples=300, seed=7)
    assert tables["visit_diff"].empty and list(tables["visit_diff"].columns)[-2:] == ["lo", "hi"]
    again = case_study({1: m}, flat, n_resamples=300, seed=7)
    assert tables["visits"].equals(again["visits"])
    other = case_study({1: m}, flat, n_resamples=300, seed=8)
    assert not np.allclose(tables["visits"]["bos_mass_lo"], other["visits"]["bos_mass_lo"])


def test_probe_tables_on_a_model(make_cfg, make_model):
    """On a random model: per-prompt masses pool to dyck_heads()'s heads, the visits are the
    head means, and run() returns the trend and the visit comparison."""
    model = make_model(make_cfg(init_std=0.3, max_seq_len=128), seed=1)
    examples = dyck_prompts(4, (0, 2), max_seq_len=128, seed=5)
    tables = case_study(dyck_masses(model, examples, batch_size=3).groups(), model.schedule)
    heads = dyck_heads(model, examples, batch_size=2, chunk=4)
    assert np.allclose(tables["heads"]["bos_mass"], heads["bos_mass"], atol=1e-6)
    means = by_visit(tables["heads"])
    merged = tables["visits"].merge(means, on=["n_demos", "layer", "visit", "depth"])
    assert np.allclose(merged["bos_mass_x"], merged["bos_mass_y"])
    assert (merged["bos_mass_lo"] <= merged["bos_mass_x"] + 1e-12).all()
    assert (merged["bos_mass_x"] <= merged["bos_mass_hi"] + 1e-12).all()
    assert set(tables["visit_diff"]["layer"]) == set(model.cfg.looped_layers)
    assert len(tables["trend"]) == 2 * len(STATS)  # two demo counts x six statistics


def test_dashboard_aggregate_and_sink_over_training(make_cfg, make_model, tmp_path):
    """The case-study page's aggregate is computed once per model and carries intervals; the
    Overview reads the sink over training from the metrics.jsonl beside each checkpoint."""
    import json

    from smelt_interp.app.pages.case_study import aggregate as case_aggregate
    from smelt_interp.app.registry import ModelRegistry
    from smelt_interp.checkpoint import save_checkpoint
    from smelt_interp.figures.sink_training import sink_over_training

    paths = {}
    for name, looped, seed in (("baseline", False, 0), ("smelt", True, 1)):
        model = make_model(make_cfg(looped=looped, max_seq_len=128), seed=seed)
        paths[name] = save_checkpoint(tmp_path / name / "ckpt.pt", model)
    records = [
        {"event": "eval", "step": s, "sink_mass/1.1": 0.1 * s, "sink03_64": 0.05 * s}
        for s in (1, 2)
    ]
    (tmp_path / "smelt" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records)
    )
    wb = Served(ModelRegistry(paths), probe_request=ProbeRequest(n_seqs=3, seq_len=32))

    fig, lines, *_ = case_aggregate.aggregate(wb, "dyck", None)
    misses = wb.table_cache.misses
    case_aggregate.aggregate(wb, "dyck", None)
    assert wb.table_cache.misses == misses == 2  # one case_study probe run per model, then cached
    bars = [t for t in fig.data if t.error_y is not None and t.error_y.array is not None]
    assert len(bars) == 3 * 2  # three panels x two models
    text = " ".join(str(x.children) for x in lines if hasattr(x, "children"))
    assert "layer 1 bos" in text and "BOS mass slope per depth" in text
    table = model_tables(wb, "case_study", "smelt")["visits"]
    assert (table["bos_mass_lo"] <= table["bos_mass"] + 1e-12).all()
    assert set(table["n_demos"]) == set(probe_inputs(wb).demos) == {0, 1, 2, 4}

    history = {n: sink_training(wb, n) for n in wb.registry.names}
    assert history["baseline"].empty and history["smelt"]["sink_mass"].tolist() == [0.1, 0.2]
    drawn = sink_over_training(history)
    assert {t.name for t in drawn.data} == {"smelt"}
