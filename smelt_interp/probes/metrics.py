"""Token-level quantities shared by the Dyck, lens and intervention probes: where a Dyck
answer is predicted, which keys are demonstration answers, next-token cross-entropy over valid
positions and teacher-forced answer accuracy, scored as the trainer scores it: the answer is
exactly right when the argmax is the reference at every answer token and a stop token (newline,
EOS, PAD or BOS) right after it, which is when greedy decoding would return the answer and stop.

Answer positions: the answer's tokens sit at [start, end); the query position that predicts
token j is j - 1, so the answer is predicted at positions start - 1 .. end - 2 (the first is
the space after "Output:")."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from smelt_interp.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

STOP_IDS = (ord("\n"), EOS_ID, PAD_ID, BOS_ID)  # what ends a greedy answer
Span = tuple[int, int]


def answer_positions(
    spans: Sequence[Span], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [b, n], valid [b, n]): the positions predicting each row's answer tokens,
    right-padded (padding repeats position 0 and is marked invalid)."""
    n = max(end - start for start, end in spans)
    pos = torch.zeros(len(spans), n, dtype=torch.long)
    valid = torch.zeros(len(spans), n, dtype=torch.bool)
    for row, (start, end) in enumerate(spans):
        pos[row, : end - start] = torch.arange(start - 1, end - 1)
        valid[row, : end - start] = True
    return pos.to(device), valid.to(device)


def span_mask(
    spans_per_row: Sequence[Sequence[Span]], width: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """[b, width] bool: True at the positions inside any of each row's spans."""
    mask = torch.zeros(len(spans_per_row), width, dtype=torch.bool)
    for row, spans in enumerate(spans_per_row):
        for start, end in spans:
            mask[row, start:end] = True
    return mask.to(device)


def next_token_ce(
    logits: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, count) of the cross-entropy of predicting token i + 1 at position i, over pairs
    whose target is valid (float64)."""
    logp = F.log_softmax(logits[:, :-1].double(), dim=-1)
    nll = -logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    keep = valid[:, 1:]
    return (nll * keep).sum(), keep.sum().double()


def answer_hits(
    logits: torch.Tensor, tokens: torch.Tensor, spans: Sequence[Span]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced argmax over each row's answer: (correct answer tokens [b], exact [b]),
    exact meaning every answer token right and a stop token predicted after the last one."""
    pos, valid = answer_positions(spans, logits.device)
    argmax = logits.argmax(dim=-1)
    pred = argmax.gather(1, pos)
    target = tokens.gather(1, pos + 1)
    right = (pred == target) | ~valid
    last = torch.tensor([end - 1 for _, end in spans], device=logits.device)
    stops = torch.isin(
        argmax.gather(1, last[:, None])[:, 0], torch.tensor(STOP_IDS, device=logits.device)
    )
    return ((pred == target) & valid).sum(dim=1), right.all(dim=1) & stops
