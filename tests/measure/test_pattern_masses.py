"""The statistics read off one prompt's materialised pattern [H, T, T] (the dashboard's views)
against plain loops: BOS share per head, the mass on per-query key sets, the answer positions'
BOS and demonstration masses per (layer, visit, head), one row's mass per named key set; and the
BOS columns recomputed from Q and K against the pattern they give."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from smelt_interp.measure.attention_stats import pattern
from smelt_interp.measure.position_mass import (
    key_set_masses,
    pattern_answer_masses,
    prompt_set_mass,
)
from smelt_interp.measure.sink import bos_columns, pattern_bos_share


def _pattern(heads: int, t: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = np.tril(rng.random((heads, t, t)))
    return w / w.sum(axis=-1, keepdims=True)


def test_pattern_statistics_equal_loops():
    w = _pattern(3, 9, 0)
    for h in range(3):
        assert pattern_bos_share(w)[h] == pytest.approx(sum(w[h, q, 0] for q in range(1, 9)) / 8)
    assert pattern_bos_share(w[:, :1, :1]).tolist() == [1.0, 1.0, 1.0]
    keys = {4: [1, 2], 7: [0, 3, 5]}
    got = prompt_set_mass(w, [4, 7], keys)
    for h in range(3):
        want = (w[h, 4, 1] + w[h, 4, 2] + w[h, 7, 0] + w[h, 7, 3] + w[h, 7, 5]) / 2
        assert got[h] == pytest.approx(want)
    assert prompt_set_mass(w, [], keys).tolist() == [0.0, 0.0, 0.0]
    row = w[1, 7, :8]
    assert key_set_masses(row, {"bos": [0], "demos": [3, 5]}) == pytest.approx(
        {"bos": row[0], "demos": row[3] + row[5]}
    )


def test_answer_masses_per_visit_and_head():
    patterns = {(0, 0): _pattern(2, 9, 1), (1, 0): _pattern(2, 9, 2), (1, 1): _pattern(2, 9, 3)}
    demos = {4: [0, 2], 7: [2, 5]}  # key 0 is BOS: never counted as a demonstration answer
    table = pattern_answer_masses(patterns, [4, 7], demos)
    assert table[["layer", "visit", "depth"]].drop_duplicates().values.tolist() == [
        [0, 0, 0],
        [1, 0, 1],
        [1, 1, 2],
    ]
    for r in table.itertuples():
        w = patterns[r.layer, r.visit][r.head]
        assert r.bos_mass == pytest.approx((w[4, 0] + w[7, 0]) / 2)
        assert r.demo_mass == pytest.approx((w[4, 2] + w[7, 2] + w[7, 5]) / 2)
    empty = pattern_answer_masses(patterns, [], {})
    assert len(empty) == 6 and all(math.isnan(v) for v in empty["bos_mass"])


def test_bos_columns_are_the_pattern_column():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 11, 4, 8, generator=gen), torch.randn(2, 11, 2, 8, generator=gen)
    valid = torch.ones(2, 11, dtype=torch.bool)
    valid[1, 7:] = False
    want = pattern(q, k, dtype=torch.float64)[..., 0]  # [b, H, T]
    want[:, :, 0] = 0  # BOS's own row is not a query
    want = want * valid[:, None, :]
    for chunk in (None, 1, 4):
        got = bos_columns(q, k, valid, chunk=chunk)
        assert got.dtype == torch.float64
        assert torch.allclose(got, want, atol=1e-6)
