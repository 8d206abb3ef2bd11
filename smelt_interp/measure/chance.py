"""Chance levels for the overlaps the probes report, each from the data it sits beside.

- Top-k attended keys: two independent uniform draws of k of the n keys a query sees share k^2/n
  keys on average, so a share of k/n. Averaged over the queries the overlap counts (those that
  see more than k keys), at each query's own length: 0.29 for top-8 on 64-token rows, 0.09 at
  320, 0.02 at 2,048. A chance-normalised overlap (O - C) / (1 - C) is 0 at chance, 1 at full.
- Routing: two independent top-k sets whose experts are picked with each visit's measured
  usage share u(e) (an expert in a token's set with probability k u(e)) share
  sum_e k^2 u0(e) u1(e) experts on average; k^2 / E is the special case of even use.
- Cosine: the same visit pair on token-shuffled rows, cos(a_t, b_pi(t)) for a random permutation
  pi of the valid tokens: what the two visits' vectors share whatever the token (a common
  direction of the layer's projections), where the paper's layer l vs l + 1 compares vectors
  projected by different weights into unrelated bases.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def topk_chance_sum(valid: torch.Tensor, top: int = 8) -> torch.Tensor:
    """Sum over the valid queries that see more than `top` keys (i >= top) of top / (i + 1), the
    expected share of a query's top-`top` keys two random draws have in common: a float64
    scalar; divide by measure.attention_stats.overlap_count for the mean."""
    t = valid.shape[1]
    pos = torch.arange(t, device=valid.device, dtype=torch.float64)
    share = torch.where(pos >= top, top / (pos + 1), torch.zeros_like(pos))
    return (valid.double() * share[None, :]).sum()


def normalised(observed: float, chance: float) -> float:
    """(observed - chance) / (1 - chance): 0 at chance, 1 at full overlap (NaN at chance 1)."""
    return (observed - chance) / (1 - chance) if chance < 1 else float("nan")


def normalised_count(observed: float, chance: float, top_k: int) -> float:
    """normalised for counts out of `top_k` (shared experts): (observed - chance) / (k - chance)."""
    return normalised(observed / top_k, chance / top_k)


def routing_chance(usage_a: torch.Tensor, usage_b: torch.Tensor, top_k: int) -> float:
    """sum_e k^2 u_a(e) u_b(e): the experts two independent top-k sets share on average when
    each visit picks expert e with its measured share of routed slots u(e) (each sums to 1)."""
    return float(top_k * top_k * (usage_a.double() * usage_b.double()).sum())


def shuffled_cos_sum(
    a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Cosine of a at each valid token with b at a random other valid token (one permutation of
    the valid tokens, drawn from `generator`), summed over valid tokens: [b, T, h, d] x2 -> [h],
    float64."""
    flat_a, flat_b = a[valid].double(), b[valid].double()  # [n, h, d]
    perm = torch.randperm(flat_b.shape[0], generator=generator).to(flat_b.device)
    return F.cosine_similarity(flat_a, flat_b[perm], dim=-1).sum(dim=0)
