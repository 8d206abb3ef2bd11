"""Held-out language-modelling loss of any model the probes read: the mean next-token
cross-entropy (nats) over every valid position of padded rows that has a next token, float64,
a batch at a time. What an untrained inference loop costs the model is this number against the
unlooped model's on the same rows."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from smelt_interp.model.protocol import LoopedModel


def loss_sums(
    logits: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor
) -> tuple[float, int]:
    """(summed cross-entropy, count) over positions i < length - 1 predicting token i + 1."""
    targets = tokens[:, 1:]
    valid = torch.arange(targets.shape[1])[None] < (lengths[:, None] - 1)
    ce = F.cross_entropy(
        logits[:, :-1].double().flatten(0, 1), targets.flatten(), reduction="none"
    ).view_as(targets)
    return float(ce[valid].sum()), int(valid.sum())


@torch.no_grad()
def next_token_loss(
    model: LoopedModel, tokens: torch.Tensor, lengths: Sequence[int] | torch.Tensor, batch: int = 8
) -> float:
    """Mean next-token cross-entropy of `model` on the rows (tokens [n, T], their lengths)."""
    lengths = torch.as_tensor(lengths)
    total, count = 0.0, 0
    for start in range(0, tokens.shape[0], batch):
        rows, lens = tokens[start : start + batch], lengths[start : start + batch]
        logits = model(rows).float().cpu()
        part, n = loss_sums(logits, rows.cpu(), lens)
        total, count = total + part, count + n
    return total / count if count else float("nan")
