"""Token-level quantities shared by the Dyck, lens and intervention probes: which keys are
demonstration answers, and next-token cross-entropy totals over valid positions. Where a Dyck
answer is predicted and how it is scored (teacher-forced, as the trainer scores it) live
in `smelt_interp.measure.dyck_score`; the per-token cross-entropy in
`smelt_interp.model.transformer`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from smelt_interp.measure.dyck_score import Span
from smelt_interp.model.transformer import next_token_ce


def span_mask(
    spans_per_row: Sequence[Sequence[Span]], width: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """[b, width] bool: True at the positions inside any of each row's spans."""
    mask = torch.zeros(len(spans_per_row), width, dtype=torch.bool)
    for row, spans in enumerate(spans_per_row):
        for start, end in spans:
            mask[row, start:end] = True
    return mask.to(device)


def ce_totals(
    logits: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, count) of the cross-entropy of predicting token i + 1 at position i, over pairs
    whose target is valid (float64)."""
    return next_token_ce(logits.double(), tokens, valid).sum(), valid[:, 1:].sum().double()
