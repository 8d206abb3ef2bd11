"""Uniform attention's levels (the case study's chance) on a hand-computed recall row: the BOS
share is the mean over the answer positions of 1 / (position + 1), the demonstration answers'
share the mean of (demonstration keys) / (keys), from the actual positions; the same through
the probe's `answer` and `non_answer` tables of a model."""

from __future__ import annotations

import math

import pytest
import torch

from smelt_interp.data.assoc_recall import FIRST_TRIGGER
from smelt_interp.data.tokenizer import BOS_ID
from smelt_interp.measure.case_positions import KEY_SETS, MAX_DEMOS, recall_case
from smelt_interp.measure.position_mass import uniform_masses
from smelt_interp.probes import case_masses, case_study

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
    masses = case_masses.recall_masses(model, torch.tensor([ROW, ROW]), (T,))
    tables = case_study.mass_tables(masses, model.schedule)
    answer = tables["answer"]
    assert answer["bos_uniform"].to_numpy() == pytest.approx(BOS_SHARE, abs=1e-12)
    assert answer["demo_share"].to_numpy() == pytest.approx(DEMO_SHARE, abs=1e-12)
    assert answer["na_bos_uniform"].to_numpy() == pytest.approx(NON_ANSWER_BOS, abs=1e-12)
    assert (answer["n_positions"] == 4).all()  # two answer positions a row
    non = tables["non_answer"]
    assert non["bos_mass_uniform"].to_numpy() == pytest.approx(NON_ANSWER_BOS, abs=1e-12)
    entropy = (math.log(3) + math.log(5) + math.log(7)) / 3
    assert non["entropy_uniform"].to_numpy() == pytest.approx(entropy, abs=1e-12)
