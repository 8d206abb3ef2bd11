"""Associative-recall rows with a trigger pool: each row draws its own trigger bytes from the pool,
every later occurrence repeats the first successor, and rows without a pool are the rows they
were before the option existed."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from helpers.recall_scan import scan

from smelt_interp.data.assoc_recall import (
    FIRST_TRIGGER,
    AssocRecallSpec,
    recall_positions,
    recall_rows,
)
from smelt_interp.data.tokenizer import BOS_ID
from smelt_interp.errors import ConfigError, DataError

POOL = tuple(range(FIRST_TRIGGER, FIRST_TRIGGER + 8))


def test_a_pool_as_large_as_the_row_triggers_changes_nothing():
    """pool == n_triggers draws nothing extra, so the random stream (and every figure measured
    on fixed-trigger rows) is the same as with no pool."""
    for n in (1, 3):
        plain = recall_rows(12, 64, seed=5, spec=AssocRecallSpec(n_triggers=n))
        pooled = recall_rows(12, 64, seed=5, spec=AssocRecallSpec(n_triggers=n, trigger_pool=n))
        assert torch.equal(plain, pooled)
    assert AssocRecallSpec(n_triggers=2).trigger_ids == (FIRST_TRIGGER, FIRST_TRIGGER + 1)


def test_each_pool_row_uses_its_own_trigger_and_repeats_its_successor():
    spec = AssocRecallSpec(n_triggers=1, trigger_pool=8)
    assert spec.trigger_ids == POOL
    rows = recall_rows(400, 64, seed=1, spec=spec).tolist()
    used = Counter()
    for row in rows:
        assert row[0] == BOS_ID
        triggers = {tok for tok in row if tok in POOL}
        assert len(triggers) <= 1, row  # one trigger byte a row
        used.update(triggers)
        successor: dict[int, int] = {}
        for i, tok in enumerate(row[:-1]):
            if tok in POOL:
                assert successor.setdefault(tok, row[i + 1]) == row[i + 1], row
    assert set(used) == set(POOL)
    # 400 rows over 8 bytes: 50 each expected; a fair draw leaves 25-75 with p < 1e-5
    assert all(25 <= count <= 75 for count in used.values()), used


def test_pool_rows_give_the_case_study_its_positions():
    spec = AssocRecallSpec(n_triggers=2, trigger_pool=5)
    rows = recall_rows(8, 80, seed=2, split="heldout", spec=spec)
    sets = recall_positions(rows, spec.trigger_ids)
    assert sets.answer.any(dim=1).all(), "every row repeats a trigger"
    for r, row in enumerate(rows.tolist()):
        ref = scan(row, spec.trigger_ids)
        assert {int(i) for i in torch.nonzero(sets.answer[r])} == ref["answer"]
        assert {int(i) for i in torch.nonzero(sets.non_answer[r])} == ref["non_answer"]
        assert len({tok for tok in row if tok in spec.trigger_ids}) <= 2


def test_a_pool_smaller_than_the_row_triggers_is_refused():
    with pytest.raises(DataError, match="trigger_pool .3. must be 0 or at least n_triggers .4."):
        AssocRecallSpec(n_triggers=4, trigger_pool=3)
    with pytest.raises((DataError, ConfigError), match="trigger_pool"):
        AssocRecallSpec.from_mapping({"n_triggers": 1, "trigger_pool": 9})
