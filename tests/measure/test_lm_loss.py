"""Held-out loss (measure.lm_loss) against a loop over positions written out with math.log,
padding and the last position of each row left out, and through a model's forward pass."""

from __future__ import annotations

import math

import torch

from smelt_interp.measure.lm_loss import loss_sums, next_token_loss


def slow_loss(logits: torch.Tensor, tokens: torch.Tensor, lengths: list[int]) -> float:
    total, count = 0.0, 0
    for row, length in enumerate(lengths):
        for i in range(length - 1):
            scores = logits[row, i].double().tolist()
            top = max(scores)
            log_z = top + math.log(sum(math.exp(s - top) for s in scores))
            total += log_z - scores[int(tokens[row, i + 1])]
            count += 1
    return total / count


def test_loss_equals_a_loop_over_positions() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=gen)
    tokens = torch.randint(0, 11, (3, 7), generator=gen)
    lengths = [7, 4, 2]
    total, count = loss_sums(logits, tokens, torch.tensor(lengths))
    assert count == 6 + 3 + 1
    assert abs(total / count - slow_loss(logits, tokens, lengths)) < 1e-12


class Fixed(torch.nn.Module):
    """A 'model' whose logits are a fixed table indexed by the current token."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.randn(11, 11, generator=torch.Generator().manual_seed(1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.table[tokens]


def test_next_token_loss_batches_rows_as_one() -> None:
    tokens = torch.randint(0, 11, (5, 6), generator=torch.Generator().manual_seed(2))
    lengths = [6, 6, 3, 5, 2]
    model = Fixed()
    want = slow_loss(model(tokens), tokens, lengths)
    for batch in (1, 2, 8):
        assert abs(next_token_loss(model, tokens, lengths, batch=batch) - want) < 1e-12
