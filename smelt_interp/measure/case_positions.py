"""The case study's position sets for both of its tasks, in one shape: per query position of a
batch of rows, which group it counts in (an answer position with n demonstrations, or a
non-answer position) and, per query, its five disjoint key sets (BOS, its demonstration
answers, the previous token, itself, the rest). One definition per task (`dyck_case`, `recall_case`)
feeds one mass computation (measure.position_mass), used by the case-study probe and the
trainer's periodic evaluation alike.

- Dyck (measure.dyck_score.answer_positions): the answer positions are the queries predicting the
  answer's tokens; n_demos is the prompt's demonstration count; the demonstration answers are
  the tokens of every demonstration's answer span; non-answer positions are the other valid
  queries after BOS.
- Associative recall (data.assoc_recall.recall_positions, its one definition): the scored
  queries are the answer positions and the first occurrences; n_demos is how many earlier
  occurrences the query's trigger has in the row (0: a first occurrence), capped at MAX_DEMOS;
  each answer position has its own demonstration answers.

The key sets partition every query's visible keys: BOS is key 0; demo is the query's
demonstration answers other than key 0; prev is key q - 1 when it is neither BOS nor a
demonstration answer; self is key q itself when it is neither BOS nor a demonstration answer
(in recall rows "T T" the second trigger is the first one's successor); rest is every other
key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from smelt_interp.data.assoc_recall import recall_positions
from smelt_interp.data.dyck import DyckExample
from smelt_interp.errors import DataError, ProbeError
from smelt_interp.measure.dyck_score import answer_positions

MAX_DEMOS = 4  # assoc_recall: n_demos 4 means 4 or more earlier occurrences
KEY_SETS = ("bos", "demo", "prev", "self", "rest")


@dataclass(frozen=True)
class CasePositions:
    """The position sets of a batch [b, T]: `n_demos` [b, T] long, the demonstration count of
    each scored answer query (-1 for the others); `non_answer` [b, T] bool; `demos` [b, T, T]
    bool, demos[r, q, k]: key k is a demonstration answer of query q; `targets` [b, T], the
    token each query predicts (the last column repeats the last token)."""

    n_demos: torch.Tensor
    non_answer: torch.Tensor
    demos: torch.Tensor
    targets: torch.Tensor

    @property
    def scored(self) -> torch.Tensor:
        """[b, T] bool: the scored answer queries, any demonstration count (for associative
        recall, first occurrences included)."""
        return self.n_demos >= 0

    def groups(self, n_groups: int) -> torch.Tensor:
        """[b, T] long, the group of each query among `n_groups`: its n_demos at answer
        queries (0 .. n_groups - 2), n_groups - 1 at non-answer ones, -1 elsewhere."""
        if int(self.n_demos.max()) > n_groups - 2:
            raise DataError(f"{n_groups} groups cannot hold n_demos {int(self.n_demos.max())}")
        non_answer = torch.full_like(self.n_demos, n_groups - 1)
        return torch.where(self.non_answer, non_answer, self.n_demos)

    def key_sets(self) -> torch.Tensor:
        """[b, T, 5, T] bool: each query's keys in KEY_SETS order, disjoint and covering all
        keys (the causally invisible ones fall in `rest` and carry no mass)."""
        b, t = self.n_demos.shape
        device = self.demos.device
        pos = torch.arange(t, device=device)
        bos = (pos == 0)[None, None, :].expand(b, t, t)
        demo = self.demos & ~bos
        prev = ((pos[None, :] == pos[:, None] - 1) & (pos[:, None] >= 2))[None] & ~demo
        itself = ((pos[None, :] == pos[:, None]) & (pos[:, None] >= 1))[None] & ~demo
        rest = ~(bos | demo | prev | itself)
        return torch.stack([bos, demo, prev, itself, rest], dim=2)

    def trimmed(self, rows: slice, width: int) -> CasePositions:
        """The sets of some rows cut to their first `width` positions (a micro-batch)."""
        return CasePositions(
            self.n_demos[rows, :width],
            self.non_answer[rows, :width],
            self.demos[rows, :width, :width],
            self.targets[rows, :width],
        )


def recall_case(tokens: torch.Tensor, trigger_ids: tuple[int, ...]) -> CasePositions:
    """The associative-recall rows' sets: answer positions and first occurrences scored, by
    earlier occurrences of their trigger (capped at MAX_DEMOS)."""
    sets = recall_positions(tokens, trigger_ids)
    earlier = sets.demos.sum(dim=-1).clamp(max=MAX_DEMOS)
    n_demos = torch.where(sets.answer, earlier, torch.where(sets.first, 0, -1))
    return CasePositions(n_demos.long(), sets.non_answer, sets.demos, sets.targets)


def dyck_case(
    examples: Sequence[DyckExample], tokens: torch.Tensor, lengths: torch.Tensor
) -> CasePositions:
    """The Dyck prompts' sets, for their right-padded `tokens` [b, T] (data.dyck.dyck_batch)
    and valid `lengths` [b]."""
    if not examples:
        raise DataError("the Dyck case study needs at least one example")
    b, t = tokens.shape
    device = tokens.device
    pos = torch.arange(t, device=device)
    q_pos, q_valid = answer_positions([ex.answer_span for ex in examples], device)
    answer = torch.zeros(b, t, dtype=torch.bool, device=device)
    answer.scatter_(1, q_pos, q_valid)  # padding repeats position 0, marked invalid
    demo_keys = torch.zeros(b, t, dtype=torch.bool, device=device)
    for row, ex in enumerate(examples):
        for start, end in ex.demo_answer_spans:
            demo_keys[row, start:end] = True
    counts = torch.tensor([ex.n_demos for ex in examples], device=device)
    n_demos = torch.where(answer, counts[:, None], -1)
    valid = pos[None, :] < lengths.to(device)[:, None]
    non_answer = valid & ~answer & (pos >= 1)[None, :]
    demos = demo_keys[:, None, :] & answer[:, :, None]
    targets = torch.cat([tokens[:, 1:], tokens[:, -1:]], dim=1)
    return CasePositions(n_demos.long(), non_answer, demos, targets)


def check_recall_rows(
    rows: torch.Tensor, trigger_ids: tuple[int, ...], what: str, *, need_demos: bool = False
) -> None:
    """Refuse, before any forward pass, associative-recall rows the case study cannot measure:
    rows with no scored query (a trigger's value), or no non-answer position, or with
    `need_demos` (the head ablation, the seeds command) no answer with an earlier
    demonstration. Short rows hold none (a row needs a trigger, its value and the trigger
    again); a ProbeError naming `what`."""
    sets = recall_case(rows, trigger_ids)
    lacking = []
    if not bool(sets.scored.any()):
        lacking.append("no answer position")
    elif need_demos and not bool((sets.n_demos >= 1).any()):
        lacking.append("no answer with an earlier demonstration")
    if not bool(sets.non_answer.any()):
        lacking.append("no non-answer position")
    if lacking:
        n, t = rows.shape
        raise ProbeError(
            f"{what}: {n} recall row(s) of {t} tokens hold {' and '.join(lacking)}; "
            f"give longer rows (--seq-len) or more of them"
        )
