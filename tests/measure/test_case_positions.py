"""The case study's position sets (data.assoc_recall.recall_positions and the case study's
per-task view of them, measure.case_positions) against a brute-force pure-Python scan of
hand-made rows: one occurrence, adjacent triggers (T a T b and T T), a trigger as the last
token, backcopy triggers, and more earlier occurrences than MAX_DEMOS."""

from __future__ import annotations

import pytest
import torch
from helpers.recall_scan import scan

from smelt_interp.data.assoc_recall import BACKCOPY, FIRST_TRIGGER, recall_positions, recall_rows
from smelt_interp.data.tokenizer import BOS_ID
from smelt_interp.measure.case_positions import MAX_DEMOS, recall_case

T, U = FIRST_TRIGGER, FIRST_TRIGGER + 1  # two recall triggers
TRIGGER_IDS = (T, U)
a, b, c, d = (ord(x) for x in "abcd")

ROWS = {
    "one occurrence": [BOS_ID, a, b, T, c, d, a],
    "T a T b": [BOS_ID, c, T, a, T, b, d],
    "T T": [BOS_ID, a, T, T, b, T, T, c],
    "trigger last": [BOS_ID, a, T, b, c, T, b, T],
    "two triggers": [BOS_ID, T, a, U, b, T, a, U, b, c],
    "backcopy": [BOS_ID, a, BACKCOPY, a, T, b, BACKCOPY, b, T, b, c],
    "many occurrences": [BOS_ID, *[T, a] * 7, b],
    "no trigger": [BOS_ID, a, b, c, d],
}


def positions(mask: torch.Tensor) -> set[int]:
    return {int(i) for i in torch.nonzero(mask).flatten()}


@pytest.mark.parametrize("name", list(ROWS))
def test_recall_positions_equal_a_brute_force_scan(name):
    row = ROWS[name]
    ref = scan(row)
    sets = recall_positions(torch.tensor([row]), TRIGGER_IDS)
    assert positions(sets.answer[0]) == ref["answer"]
    assert positions(sets.first[0]) == ref["first"]
    assert positions(sets.non_answer[0]) == ref["non_answer"]
    for q in range(len(row)):
        assert positions(sets.demos[0, q]) == ref["demos"].get(q, set()), q
    assert sets.targets[0, :-1].tolist() == row[1:]


@pytest.mark.parametrize("name", list(ROWS))
def test_case_groups_and_key_sets_follow_the_scan(name):
    """n_demos counts earlier occurrences (0 at first occurrences, capped), the non-answer
    group is last, and the five key sets partition every query's keys as defined."""
    row = ROWS[name]
    ref = scan(row)
    case = recall_case(torch.tensor([row]), TRIGGER_IDS)
    n_groups = MAX_DEMOS + 2
    groups = case.groups(n_groups)[0].tolist()
    keys = case.key_sets()[0]  # [T, 5, T]
    for q in range(len(row)):
        if q in ref["n"]:
            assert groups[q] == ref["n"][q]
        elif q in ref["non_answer"]:
            assert groups[q] == n_groups - 1
        else:
            assert groups[q] == -1
        demo = ref["demos"].get(q, set())
        prev = {q - 1} if q - 1 >= 1 and q - 1 not in demo else set()
        assert positions(keys[q, 0]) == {0}
        assert positions(keys[q, 1]) == demo
        assert positions(keys[q, 2]) == prev
        itself = {q} if q >= 1 and q not in demo else set()
        assert positions(keys[q, 3]) == itself
        assert positions(keys[q, 4]) == set(range(len(row))) - {0} - demo - prev - itself
    if name == "many occurrences":
        assert max(groups) == n_groups - 1 and MAX_DEMOS in groups  # 6 earlier -> capped at 4


def test_generated_rows_match_the_scan_too():
    rows = recall_rows(6, 80, seed=3, split="heldout")
    sets = recall_positions(rows, (16, 17, 18))
    for r, row in enumerate(rows.tolist()):
        ref = scan(row, (16, 17, 18))
        assert positions(sets.answer[r]) == ref["answer"]
        assert positions(sets.first[r]) == ref["first"]
        assert positions(sets.non_answer[r]) == ref["non_answer"]
        assert ref["answer"], "a generated row repeats its triggers"
