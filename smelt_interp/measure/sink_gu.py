"""Sink^0.3 as Gu et al. compute it ("When Attention Sink Emerges in Language Models", ICLR
2025; their evaluation script's `compute_attention_sink`): for each sample, layer and head, the
first key's importance, the sum over the first T queries (query 0 included) of the attention on
key 0, divided by T (T = 64 there, every sample at least that long); a head sinks in a sample
when that importance exceeds 0.3; Sink^0.3 is that indicator averaged over samples, layers and
heads. Here "layers" are the (layer, visit)s of the schedule, and a row shorter than the window
gives T = its own length (Gu et al. keep no such row).

The threshold is applied per sample. The figure measure.sink computed before (and still does,
under the name POOLED_NAME) pools every row's queries 1..63 and thresholds once: a head that sinks
in half the rows and not at all in the rest can come out at 0 or 1 there and at 0.5 here."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from smelt_interp.measure.position_mass import RowsFn

# Gu et al.'s threshold and window: a head sinks in a sample when its first key's importance
# over the first WINDOW queries exceeds THRESHOLD.
THRESHOLD = 0.3
WINDOW = 64

GU_NAME = "Sink^0.3 (Gu et al.)"
GU_KEY = "sink03_gu"  # the trainer's metrics key, the probes' column
POOLED_NAME = f"pooled Sink^0.3 (rows' queries 1..{WINDOW - 1} pooled, then thresholded)"


def importance_from_column(column: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Each sample's first-key importance [b, H], float64, from the attention of its first T
    queries on key 0, `column` [b, H, T] (query 0 included), and their validity [b, T]: the sum
    over the valid queries divided by how many there are (NaN for a row with none)."""
    valid = valid.to(column.device)
    total = (column.double() * valid[:, None, :]).sum(dim=-1)
    return total / valid.sum(dim=-1).double()[:, None]


def first_key_importance(
    rows_of: RowsFn, valid: torch.Tensor, window: int = WINDOW
) -> torch.Tensor:
    """importance_from_column of one visit's attention rows (measure.position_mass.visit_rows)
    over the first `window` queries of each row: [b, H], float64."""
    t = min(window, valid.shape[1])
    pos = torch.arange(t, device=valid.device)
    rows = rows_of(pos, t)  # [b, H, t, t]
    return importance_from_column(rows[..., 0].to(valid.device), valid[:, :t])


def importance_from_pattern(
    pattern: torch.Tensor, valid: torch.Tensor, window: int = WINDOW
) -> torch.Tensor:
    """importance_from_column of a materialised pattern [b, H, T, T] (a `hook_pattern`)."""
    t = min(window, pattern.shape[-2])
    return importance_from_column(pattern[:, :, :t, 0], valid[:, :t])


def sink_indicator(importance: torch.Tensor, threshold: float = THRESHOLD) -> torch.Tensor:
    """1.0 where a (sample, head)'s importance exceeds `threshold`, else 0.0 (float64)."""
    return (importance > threshold).double()


def head_totals(
    importance: torch.Tensor, threshold: float = THRESHOLD
) -> tuple[torch.Tensor, torch.Tensor]:
    """(importance summed over samples [H], samples over `threshold` per head [H]) of one
    visit's [b, H] importance: what a probe pools over micro-batches (divide by the samples)."""
    return importance.sum(dim=0), sink_indicator(importance, threshold).sum(dim=0)


def sample_shares(
    importances: Sequence[torch.Tensor], threshold: float = THRESHOLD
) -> torch.Tensor:
    """Per sample [b]: the share of (visit, head)s over `threshold`, from each visit's [b, H]
    importance (every visit has the same head count, so this averages over visits and heads)."""
    stacked = torch.stack([sink_indicator(i, threshold) for i in importances], dim=1)
    return stacked.flatten(start_dim=1).mean(dim=1)


def gu_sink03(importances: Sequence[torch.Tensor], threshold: float = THRESHOLD) -> float:
    """Sink^0.3 over samples, visits and heads from each visit's [b, H] importance."""
    return float(sample_shares(importances, threshold).mean())
