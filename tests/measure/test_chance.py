"""Each chance level of measure.chance against a Monte-Carlo draw of what it claims to be, and the
probes that set them beside their overlaps (similarity, routing) on a random tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from smelt_interp.measure.attention_stats import overlap_count, topk_overlap_rows
from smelt_interp.measure.chance import (
    normalised,
    routing_chance,
    shuffled_cos_sum,
    topk_chance_sum,
)
from smelt_interp.measure.position_mass import pattern_rows
from smelt_interp.probes import routing, similarity


def random_pattern(b: int, h: int, t: int, gen: torch.Generator) -> torch.Tensor:
    """Causal attention [b, H, T, T] from independent Gaussian logits: each row's top-k is a
    uniform draw of the keys it sees."""
    logits = torch.randn(b, h, t, t, generator=gen, dtype=torch.float64)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    return logits.masked_fill(~mask, float("-inf")).softmax(dim=-1)


def test_topk_chance_is_the_overlap_of_random_top_k_sets():
    gen = torch.Generator().manual_seed(0)
    b, h, t, top = 48, 4, 64, 8
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[:8, 40:] = False  # shorter rows: the chance follows each query's own length
    a = pattern_rows(random_pattern(b, h, t, gen))
    c = pattern_rows(random_pattern(b, h, t, gen))
    n = overlap_count(valid, top)
    drawn = float(topk_overlap_rows(a, c, valid, top).sum() / (n * h))
    chance = float(topk_chance_sum(valid, top) / n)
    assert drawn == pytest.approx(chance, abs=0.01)  # about 7 standard errors
    # the figures for full rows: 0.29 at 64 tokens, 0.09 at 320, 0.02 at 2,048
    for length, expected in ((64, 0.29), (320, 0.09), (2048, 0.02)):
        full = torch.ones(1, length, dtype=torch.bool)
        level = float(topk_chance_sum(full, 8) / overlap_count(full, 8))
        assert level == pytest.approx(expected, abs=0.005)


def test_routing_chance_is_the_overlap_of_independent_sets_with_the_measured_usage():
    gen = torch.Generator().manual_seed(1)
    n_tokens, n_experts, k = 20_000, 8, 2

    def draw(logits: torch.Tensor) -> torch.Tensor:  # Gumbel top-k: k distinct experts a token
        gumbel = -torch.log(-torch.log(torch.rand(n_tokens, n_experts, generator=gen)))
        return (logits + gumbel).topk(k, dim=-1).indices

    idx_a = draw(torch.linspace(2.0, -2.0, n_experts))
    idx_b = draw(torch.linspace(-1.0, 1.5, n_experts))
    usage = [torch.bincount(i.reshape(-1), minlength=n_experts) / i.numel() for i in (idx_a, idx_b)]
    shared = routing.overlap_counts(idx_a[None], idx_b[None]).double().mean()
    chance = routing_chance(usage[0], usage[1], k)
    assert float(shared) == pytest.approx(chance, abs=0.03)
    assert abs(chance - k * k / n_experts) > 0.1  # uneven use: even use's k^2/E is off


def test_shuffled_cosine_is_the_mean_over_random_pairings():
    gen = torch.Generator().manual_seed(2)
    common = torch.randn(1, 1, 3, 6, generator=gen, dtype=torch.float64)
    a = common + 0.8 * torch.randn(2, 9, 3, 6, generator=gen, dtype=torch.float64)
    b = a + 0.3 * torch.randn(2, 9, 3, 6, generator=gen, dtype=torch.float64)
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[1, 6:] = False
    n = int(valid.sum())
    flat_a, flat_b = a[valid], b[valid]
    # over a uniform permutation every (s, t) pairing is equally likely
    exact = F.cosine_similarity(flat_a[:, None], flat_b[None, :], dim=-1).mean(dim=(0, 1))
    draws = torch.stack([shuffled_cos_sum(a, b, valid, gen) / n for _ in range(3000)])
    assert draws.mean(dim=0).numpy() == pytest.approx(exact.numpy(), abs=0.01)
    aligned = F.cosine_similarity(flat_a, flat_b, dim=-1).mean(dim=0)
    assert (aligned > exact + 0.2).all()  # the control sits below what the same tokens share


def test_normalised():
    assert normalised(0.29, 0.29) == 0.0 and normalised(1.0, 0.29) == 1.0
    assert normalised(0.645, 0.29) == pytest.approx(0.5)


@pytest.fixture
def model(make_cfg, make_model):
    return make_model(make_cfg(init_std=0.5, max_seq_len=128), seed=4)


def test_probes_set_chance_beside_each_overlap(model, make_tokens):
    tokens = make_tokens(3, 40, seed=3)
    lengths = torch.tensor([40, 30, 20])
    heads = similarity.measure(model, tokens, lengths, batch_size=2)
    expected = np.mean([8 / (i + 1) for n in (40, 30, 20) for i in range(8, n)])
    assert heads["top8_chance"].to_numpy() == pytest.approx(expected)
    assert heads["ctrl_top8_chance"].dropna().to_numpy() == pytest.approx(expected)
    norm = (heads["top8_overlap"] - expected) / (1 - expected)
    assert heads["top8_overlap_norm"].to_numpy() == pytest.approx(norm.to_numpy())
    assert heads[["shuf_cos_q", "shuf_cos_k", "shuf_cos_v"]].notna().all().all()
    summ = similarity.summarize({"heads": heads}).set_index("statistic")["paper"]
    assert summ["top8_overlap (visit 0 vs 1)"] == "0.56-0.66"
    # another k: the paper's top-8 band only with the k named as different
    four = similarity.measure(model, tokens, lengths, batch_size=2, top=4)
    summ = similarity.summarize({"heads": four}).set_index("statistic")["paper"]
    assert "k differs" in summ["top4_overlap (visit 0 vs 1)"]

    result = routing.tables(model, tokens, lengths)
    usage = result["usage"]
    shares = usage.set_index(["layer", "visit"])["share"]
    for r in result["overlap"].itertuples():
        u = [torch.tensor(shares.loc[(r.layer, v)].to_numpy()) for v in (r.visit, r.other_visit)]
        assert r.chance == pytest.approx(routing_chance(u[0], u[1], r.top_k))
    summ = routing.summarize(result).set_index("statistic")["paper"]
    k = int(result["overlap"]["top_k"].iloc[0])
    assert ("k differs" in summ.iloc[0]) == (k != 8)
