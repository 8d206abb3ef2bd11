"""Computed-class recall (data.computed_recall): the class function against the tables read
in a slow loop, the per-row label mapping (fresh across rows, consistent within one, shuffled
in the control), the shallow key's dependence on x alone, and the position sets against a
hand-built row."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from smelt_interp.data.computed_recall import (
    ARROW,
    SEP,
    ComputedRecallSpec,
    computed_positions,
    computed_rows,
    n_demos_for,
    triple_classes,
)
from smelt_interp.data.tokenizer import BOS_ID, PAD_ID
from smelt_interp.errors import ConfigError, DataError

SPEC = ComputedRecallSpec(n_symbols=8, n_mid=8, n_classes=4)


def demos_of(row: list[int]) -> list[tuple[int, int, int, int]]:
    """(x, y, z, label) symbol indices and label id of each `=` of a row, in order."""
    out = []
    for i, tok in enumerate(row):
        if tok == ARROW:
            x, y, z = (row[i - k] - ord("a") for k in (3, 2, 1))
            out.append((x, y, z, row[i + 1]))
    return out


def test_the_class_is_f2_of_f1_and_the_vectorised_classes_agree():
    f1, f2, _ = SPEC.tables
    rows = computed_rows(20, 66, seed=1, spec=SPEC)
    classes = triple_classes(rows, SPEC)
    for r, row in enumerate(rows.tolist()):
        arrows = [i for i, t in enumerate(row) if t == ARROW]
        assert (classes[r] >= 0).nonzero().flatten().tolist() == arrows
        for i, (x, y, z, _) in zip(arrows, demos_of(row)):
            assert classes[r, i] == SPEC.class_of(x, y, z) == f2[f1[x][y]][z]


def test_rows_are_bos_demonstrations_query_and_pad():
    rows = computed_rows(8, 70, seed=2, spec=SPEC)
    n = n_demos_for(70)
    assert n == 10 and rows.shape == (8, 70)
    for row in rows.tolist():
        assert row[0] == BOS_ID
        used = 1 + 6 * n + 5
        assert row[used:] == [PAD_ID] * (70 - used)
        assert row[1:used].count(ARROW) == n + 1 and row[1:used].count(SEP) == n
        assert all(ord("a") <= t < ord("a") + SPEC.n_symbols for t in row[1:used:6])


def test_each_row_maps_classes_to_labels_afresh_and_shows_the_query_class():
    mappings = Counter()
    for row in computed_rows(300, 66, seed=3, spec=SPEC).tolist():
        seen: dict[int, int] = {}
        demos = demos_of(row)
        for x, y, z, label in demos:
            c = SPEC.class_of(x, y, z)
            assert seen.setdefault(c, label) == label  # one label per class within a row
        assert len(set(seen.values())) == len(seen)  # and different classes, different labels
        query = SPEC.class_of(*demos[-1][:3])
        assert query in {SPEC.class_of(*d[:3]) for d in demos[:-1]}
        mappings[tuple(sorted(seen.items()))] += 1
    assert len(mappings) > 50  # fresh mappings, not a fixed one
    labels_of_class_0 = {dict(m).get(0) for m in mappings} - {None}
    assert labels_of_class_0 == set(SPEC.label_ids)


def test_the_shuffled_control_breaks_the_mapping():
    spec = ComputedRecallSpec(n_symbols=8, n_mid=8, n_classes=4, consistent_labels=False)
    broken = 0
    for row in computed_rows(100, 66, seed=4, spec=spec).tolist():
        by_class: dict[int, set[int]] = {}
        for x, y, z, label in demos_of(row):
            by_class.setdefault(spec.class_of(x, y, z), set()).add(label)
        broken += any(len(v) > 1 for v in by_class.values())
    assert broken > 90


def test_the_shallow_key_depends_on_x_alone_and_is_balanced():
    spec = ComputedRecallSpec(n_symbols=8, n_mid=8, n_classes=4, key="shallow")
    for x in range(8):
        assert len({spec.class_of(x, y, z) for y in range(8) for z in range(8)}) == 1
    assert Counter(spec.class_of(x, 0, 0) for x in range(8)) == {c: 2 for c in range(4)}
    deep = [SPEC.class_of(0, y, z) for y in range(8) for z in range(8)]
    assert len(set(deep)) > 1  # the deep key needs y and z too


def test_rows_are_a_pure_function_of_seed_and_split():
    a = computed_rows(4, 66, seed=5, spec=SPEC)
    assert torch.equal(a, computed_rows(4, 66, seed=5, spec=SPEC))
    assert not torch.equal(a, computed_rows(4, 66, seed=5, split="heldout", spec=SPEC))
    other_tables = ComputedRecallSpec(n_symbols=8, n_mid=8, n_classes=4, table_seed=1)
    assert other_tables.tables != SPEC.tables


def test_position_sets_of_a_hand_built_row():
    a1, a2, a3 = SPEC.by_class[0][:3]
    (b1,) = SPEC.by_class[1][:1]

    def demo(triple, label, sep=True):
        return [ord("a") + s for s in triple] + [ARROW, label] + ([SEP] if sep else [])

    row = [BOS_ID, *demo(a1, 65), *demo(b1, 66), *demo(a2, 65), *demo(a3, 65, sep=False), PAD_ID]
    tokens = torch.tensor([row])
    p = computed_positions(tokens, SPEC)
    arrows = [4, 10, 16, 22]  # the `=` of each block
    labels = [a + 1 for a in arrows]
    assert p.first[0].nonzero().flatten().tolist() == arrows[:2]
    assert p.answer[0].nonzero().flatten().tolist() == arrows[2:]
    assert p.query[0].nonzero().flatten().tolist() == [22]
    assert p.demos[0, 16].nonzero().flatten().tolist() == [labels[0]]
    assert p.demos[0, 22].nonzero().flatten().tolist() == [labels[0], labels[2]]
    assert not p.demos[0, 10].any()  # not an answer position: no demonstration answers
    # non-answer: every position after BOS with a target that is not `=`; the query's label
    # predicts PAD, the PAD itself nothing
    expected = [q for q in range(1, 23) if q not in arrows]
    assert p.non_answer[0].nonzero().flatten().tolist() == expected
    assert p.classes[0, arrows].tolist() == [0, 1, 0, 0]
    assert p.targets[0, 22] == 65


def test_bad_specs_and_lengths_are_one_line_errors():
    with pytest.raises(DataError, match="n_classes"):
        ComputedRecallSpec(n_symbols=4, n_classes=6)
    with pytest.raises(DataError, match="length >= 12"):
        computed_rows(1, 11, spec=SPEC)
    with pytest.raises(ConfigError, match="computed_recall"):
        ComputedRecallSpec.from_mapping({"n_symbol": 3})
    with pytest.raises(DataError):
        ComputedRecallSpec(key="middle")
