"""Uniform attention's levels (the case study's chance) on a hand-computed recall row: the BOS
share is the mean over the answer positions of 1 / (position + 1), the demonstration answers'
share the mean of (demonstration keys) / (keys), from the actual positions; the same through
the probe's `answer`, `non_answer` and `levels` tables of a model; and measure.levels, where
every chance level is written, on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from smelt_interp.data.assoc_recall import FIRST_TRIGGER, AssocRecallSpec, recall_rows
from smelt_interp.data.tokenizer import BOS_ID
from smelt_interp.measure import case_tables, group_masses, levels
from smelt_interp.measure.case_positions import KEY_SETS, MAX_DEMOS, recall_case
from smelt_interp.measure.position_mass import uniform_masses

T = FIRST_TRIGGER
a, b = ord("a"), ord("b")
# positions 0..7: T at 1 (first occurrence), 3 (demonstration at 2) and 5 (at 2 and 4);
# non-answer positions 2, 4, 6 (7 is last and predicts nothing)
ROW = [BOS_ID, T, a, T, a, T, a, b]
BOS_SHARE = (1 / 4 + 1 / 6) / 2
DEMO_SHARE = (1 / 4 + 2 / 6) / 2
NON_ANSWER_BOS = (1 / 3 + 1 / 5 + 1 / 7) / 3


def test_uniform_levels_by_hand():
    case = recall_case(torch.tensor([ROW]), (T,))
    n_groups = MAX_DEMOS + 2
    groups = case.groups(n_groups)
    sums = uniform_masses(groups, n_groups, case.key_sets())[0]  # [G, 5 sets + entropy]
    counts = torch.bincount(groups[groups >= 0], minlength=n_groups).double()
    answer = sums[1:-1].sum(dim=0) / counts[1:-1].sum()
    assert counts.tolist() == [1, 1, 1, 0, 0, 3]  # q=1; q=3 (1 demo); q=5 (2 demos); non-answer
    assert float(answer[KEY_SETS.index("bos")]) == pytest.approx(BOS_SHARE, abs=1e-12)
    assert float(answer[KEY_SETS.index("demo")]) == pytest.approx(DEMO_SHARE, abs=1e-12)
    assert float(answer[-1]) == pytest.approx((math.log(4) + math.log(6)) / 2, abs=1e-12)
    assert float(sums[:, :-1].sum()) == pytest.approx(float(counts.sum()), abs=1e-12)  # a row each
    non = sums[-1] / counts[-1]
    assert float(non[KEY_SETS.index("bos")]) == pytest.approx(NON_ANSWER_BOS, abs=1e-12)
    assert float(non[KEY_SETS.index("self")]) == pytest.approx(NON_ANSWER_BOS, abs=1e-12)
    # one previous token (never BOS, never a demonstration answer here) and one self key each
    assert float(non[KEY_SETS.index("prev")]) == pytest.approx(NON_ANSWER_BOS, abs=1e-12)
    rest = (0 / 3 + 2 / 5 + 4 / 7) / 3  # q + 1 keys less BOS, prev and self
    assert float(non[KEY_SETS.index("rest")]) == pytest.approx(rest, abs=1e-12)


def test_the_probe_prints_the_same_levels(make_cfg, make_model):
    model = make_model(make_cfg(init_std=0.3, max_seq_len=64), seed=4)
    masses = group_masses.recall_masses(model, torch.tensor([ROW, ROW]), (T,))
    tables = case_tables.mass_tables(masses, model.schedule)
    answer = tables["answer"]
    assert answer["bos_uniform"].to_numpy() == pytest.approx(BOS_SHARE, abs=1e-12)
    assert answer["demo_share"].to_numpy() == pytest.approx(DEMO_SHARE, abs=1e-12)
    assert answer["na_bos_uniform"].to_numpy() == pytest.approx(NON_ANSWER_BOS, abs=1e-12)
    assert (answer["n_positions"] == 4).all()  # two answer positions a row
    non = tables["non_answer"]
    assert non["bos_mass_uniform"].to_numpy() == pytest.approx(NON_ANSWER_BOS, abs=1e-12)
    entropy = (math.log(3) + math.log(5) + math.log(7)) / 3
    assert non["entropy_uniform"].to_numpy() == pytest.approx(entropy, abs=1e-12)


def test_chance_levels_by_hand():
    assert levels.chance_level([1, 3]) == pytest.approx((1 / 2 + 1 / 4) / 2, abs=1e-15)
    assert levels.chance_level([3, 5], [1, 2]) == pytest.approx(DEMO_SHARE, abs=1e-15)
    assert math.isnan(levels.chance_level([]))
    # rows of 4 and 2 tokens: queries 1, 2, 3 and 1; a window of 3 keeps 1, 2 and 1
    assert levels.uniform_bos([4, 2]) == pytest.approx((1 / 2 + 1 / 3 + 1 / 4 + 1 / 2) / 4)
    assert levels.uniform_bos(torch.tensor([4, 2]), window=3) == pytest.approx(
        (1 / 2 + 1 / 3 + 1 / 2) / 3
    )
    assert levels.uniform_bos_share(256) == pytest.approx(
        sum(1 / (q + 1) for q in range(1, 256)) / 255
    )
    assert levels.uniform_bos_share(1) == 1.0  # BOS alone attends only to itself
    got = levels.answer_levels([3, 5], {3: [2], 5: [0, 2, 4]})  # key 0 is BOS, not a demo
    assert got == pytest.approx({"uniform_bos": BOS_SHARE, "demo_share": DEMO_SHARE})
    assert levels.answer_levels([], {}) == {}


def test_case_levels_of_the_row_by_hand():
    got = levels.case_levels(recall_case(torch.tensor([ROW]), (T,))).set_index("n_demos")
    assert got.index.tolist() == [0, 1, 2, -1]
    assert got["n"].tolist() == [1, 1, 1, 3]
    assert got.loc[0, "uniform_bos"] == pytest.approx(1 / 2) and got.loc[0, "demo_share"] == 0
    assert got.loc[1, "demo_share"] == pytest.approx(1 / 4)
    assert got.loc[2, "demo_share"] == pytest.approx(2 / 6)
    assert got.loc[-1, "uniform_bos"] == pytest.approx(NON_ANSWER_BOS)
    assert math.isnan(got.loc[-1, "demo_share"])


def test_the_probe_levels_equal_the_position_sets_levels(make_cfg, make_model):
    """The probe's `levels` table (uniform attention's sums as it measured them, chunked) equals
    case_levels of the same rows (numpy over the position sets), on generated rows."""
    model = make_model(make_cfg(init_std=0.3, max_seq_len=64), seed=4)
    spec = AssocRecallSpec(n_triggers=2, trigger_share=0.2, alphabet=26)
    rows = recall_rows(6, 48, seed=3, spec=spec)
    masses = group_masses.recall_masses(model, rows, spec.trigger_ids, batch_size=4, chunk=8)
    got = case_tables.mass_tables(masses, model.schedule)["levels"]
    want = levels.case_levels(recall_case(rows, spec.trigger_ids))
    assert got["n_demos"].tolist() == want["n_demos"].tolist()
    assert got["n"].tolist() == want["n"].tolist()
    for column in ("uniform_bos", "demo_share"):
        assert got[column].to_numpy() == pytest.approx(want[column].to_numpy(), nan_ok=True)
