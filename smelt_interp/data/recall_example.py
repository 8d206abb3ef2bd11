"""One held-out associative-recall row as a page shows it: its ids and labels (triggers named
T0, T1, ...), its text, and the position sets of data.assoc_recall (answer and first query
positions, each answer's demonstrations, the token each query predicts)."""

from __future__ import annotations

from dataclasses import dataclass

from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_positions, recall_rows
from smelt_interp.data.prompt_text import display_labels


@dataclass(frozen=True)
class RecallExample:
    """One held-out associative-recall row as the case-study page shows it: `ids` (BOS first),
    `labels` (triggers as T0, T1, ...), `text` (the row after BOS, as a prompt), the
    position sets of data.assoc_recall (`answer`, `first` query positions; `demos`: answer
    position -> the positions of its demonstration answers) and `targets` (the token each
    query predicts)."""

    index: int
    ids: list[int]
    labels: list[str]
    text: str
    answer: list[int]
    first: list[int]
    demos: dict[int, list[int]]
    targets: list[int]
    trigger_ids: tuple[int, ...]


def recall_example(index: int, spec: AssocRecallSpec, length: int) -> RecallExample:
    """Held-out row `index` (data.assoc_recall.recall_rows, split "heldout", seed `index`)."""
    row = recall_rows(1, length, seed=index, split="heldout", spec=spec)
    sets = recall_positions(row, spec.trigger_ids)
    ids = row[0].tolist()
    names = {t: f"T{i}" for i, t in enumerate(spec.trigger_ids)}
    answer = sets.answer[0].nonzero().flatten().tolist()
    return RecallExample(
        index=index,
        ids=ids,
        labels=[names.get(i, label) for i, label in zip(ids, display_labels(ids))],
        text=bytes(ids[1:]).decode("latin-1"),
        answer=answer,
        first=sets.first[0].nonzero().flatten().tolist(),
        demos={q: sets.demos[0, q].nonzero().flatten().tolist() for q in answer},
        targets=sets.targets[0].tolist(),
        trigger_ids=spec.trigger_ids,
    )
