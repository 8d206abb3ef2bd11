"""The head followed from visit 0 to visit 1 is chosen on rows apart from the rows reported:
the selection rows share no row with them, the choice reads the selection tables only, and on
noise alone a choice made on the reported rows would show a fall at visit 1 that a choice on
other rows does not."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from smelt_interp.commands import case_seed_tables
from smelt_interp.commands.seed_report import (
    REPORT_SEED,
    SELECTION_SEED,
    recall_inputs,
    selection_inputs,
)
from smelt_interp.config import ModelConfig
from smelt_interp.data.assoc_recall import AssocRecallSpec
from smelt_interp.measure.case_tables import MEAN_HEAD
from smelt_interp.model.transformer import SmeltModel

STATS = ("bos_mass", "demo_mass", "na_bos_mass")


def visit_pairs(visit_0: np.ndarray, visit_1: np.ndarray) -> pd.DataFrame:
    """A `visit_pairs` table of one looped layer (layer 1): per head its two visits' masses."""
    rows = []
    for stat in STATS:
        for head, (a, b) in enumerate(zip(visit_0, visit_1)):
            rows.append({"layer": 1, "head": str(head), "statistic": stat, "visit_0": a})
            rows[-1] |= {"visit_1": b, "diff": b - a, "lo": b - a, "hi": b - a}
        a, b = float(np.mean(visit_0)), float(np.mean(visit_1))
        rows.append({"layer": 1, "head": MEAN_HEAD, "statistic": stat, "visit_0": a})
        rows[-1] |= {"visit_1": b, "diff": b - a, "lo": b - a, "hi": b - a}
    return pd.DataFrame(rows)


def test_selection_rows_are_not_reported_rows():
    torch.manual_seed(0)
    shape = {"d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 2, "d_head": 16}
    model = SmeltModel(ModelConfig.baseline(**shape, n_experts=2, top_k=1, d_expert=32)).eval()
    spec = AssocRecallSpec()
    reported = recall_inputs(model, spec, 16, 64)
    chosen_on = selection_inputs(model, spec, 16, 64)
    assert (reported.seed, chosen_on.seed) == (REPORT_SEED, SELECTION_SEED)
    seen = {tuple(r.tolist()) for r in reported.recall_rows()}
    assert not any(tuple(r.tolist()) in seen for r in chosen_on.recall_rows())


def test_the_choice_reads_the_selection_rows_only():
    """Head 1 leads at visit 0 on the reported rows, head 0 on the selection rows: head 0 is
    followed, whatever the reported rows say."""
    report = {"visit_pairs": visit_pairs(np.array([0.4, 0.6]), np.array([0.5, 0.1]))}
    selection = {"visit_pairs": visit_pairs(np.array([0.7, 0.2]), np.array([0.0, 0.0]))}
    chosen = case_seed_tables.choose_heads(selection)
    assert chosen == {(1, stat): 0 for stat in STATS}
    row = case_seed_tables.pair_figures(report, chosen).iloc[0]
    assert row["bos_same_head"] == 0 and row["bos_same"] == pytest.approx(0.1)
    frames = case_seed_tables.checkpoint_figures(
        report | {"answer": _answer(), "non_answer": _non_answer()}, selection
    )
    assert frames["pairs"].iloc[0]["demo_same_head"] == 0


def test_choosing_on_the_reported_rows_biases_the_change_and_disjoint_rows_do_not():
    """8 heads of equal true mass at both visits, measured with noise: following the head that
    looks best at visit 0 on the same rows shows a fall (regression to the mean); chosen on
    other rows, the mean change is about 0."""
    rng = np.random.default_rng(0)
    same, apart = [], []
    for _ in range(400):
        report = visit_pairs(*(0.5 + 0.05 * rng.standard_normal((2, 8))))
        other = visit_pairs(*(0.5 + 0.05 * rng.standard_normal((2, 8))))
        for tables, out in (({"visit_pairs": report}, same), ({"visit_pairs": other}, apart)):
            chosen = case_seed_tables.choose_heads(tables)
            out.append(case_seed_tables.pair_figures({"visit_pairs": report}, chosen))
    biased = pd.concat(same)["bos_same"].mean()
    clean = pd.concat(apart)["bos_same"]
    assert biased < -0.05  # the expected maximum of 8 normals is 1.42 sd: -0.07
    assert abs(clean.mean()) < 4 * clean.std() / np.sqrt(len(clean))


def _answer() -> pd.DataFrame:
    cols = {f"{c}{s}": 0.1 for c in case_seed_tables.VISIT_STATS for s in ("", "_lo", "_hi")}
    heads = {c: 0 for c in case_seed_tables.BEST_HEADS}
    refs = {c: 0.1 for c in case_seed_tables.REFERENCES}
    return pd.DataFrame([{"layer": 1, "visit": 0, "n_heads": 2} | cols | heads | refs])


def _non_answer() -> pd.DataFrame:
    stats = case_seed_tables.SPLIT_STATS + case_seed_tables.SPLIT_UNIFORM
    return pd.DataFrame([{"layer": 1, "visit": 0, "head": 0} | {s: 0.2 for s in stats}])
