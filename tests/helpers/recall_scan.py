"""A brute-force, pure-Python scan of a recall row's case-study positions: the reference that
measure.case_positions and the case-study probe are tested against."""

from __future__ import annotations

from smelt_interp.data.assoc_recall import FIRST_TRIGGER
from smelt_interp.data.trigger import TRIGGERS
from smelt_interp.measure.case_positions import MAX_DEMOS

TRIGGER_IDS = (FIRST_TRIGGER, FIRST_TRIGGER + 1)  # two recall triggers


def scan(row: list[int], trigger_ids: tuple[int, ...] = TRIGGER_IDS) -> dict:
    """The module docstring's definitions, position by position."""
    others = {ord(ch) for ch in TRIGGERS.values()}
    out: dict = {"answer": set(), "first": set(), "non_answer": set(), "demos": {}, "n": {}}
    for q, tok in enumerate(row):
        if q + 1 >= len(row):
            continue  # the last position predicts nothing in the row: no set
        if tok in trigger_ids:
            earlier = [i for i in range(q) if row[i] == tok]
            if earlier:
                out["answer"].add(q)
                out["demos"][q] = {i + 1 for i in earlier}
            else:
                out["first"].add(q)
            out["n"][q] = min(len(earlier), MAX_DEMOS)
        elif tok not in others and q >= 1:
            out["non_answer"].add(q)
    return out
