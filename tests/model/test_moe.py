"""MoE: grouped_mm dispatch against the per-expert loop (forward and gradients), renormalised
top-k routing, and the router losses against hand computations."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from smelt_interp.config import ModelConfig
from smelt_interp.model import moe as moe_mod
from smelt_interp.model.grouped_mm import grouped_mm
from smelt_interp.model.moe import Experts, router_losses
from smelt_interp.model.protocol import hook_name


def projection_loss(y: torch.Tensor, seed: int = 1) -> torch.Tensor:
    """A random projection of y: grouped_mm's CPU backward rejects sum()'s stride-0 gradient."""
    gen = torch.Generator().manual_seed(seed)
    return (y * torch.randn(y.shape, generator=gen, dtype=y.dtype)).sum()


def _routing(n: int, n_experts: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    indices = torch.stack([torch.randperm(n_experts, generator=gen)[:k] for _ in range(n)])
    weights = torch.rand(n, k, generator=gen).softmax(-1)
    return indices, weights


@pytest.mark.parametrize("n_experts, k, n", [(4, 2, 16), (8, 1, 3), (8, 8, 10), (16, 4, 37)])
def test_grouped_matches_loop_forward_and_grad(n_experts: int, k: int, n: int) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, d_expert=12, n_experts=n_experts, top_k=k)
    experts = Experts(cfg)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(n, 16)
    indices, weights = _routing(n, n_experts, k)  # (8, 1, 3): most experts get no token

    results = []
    for dispatch in ("grouped", "loop"):
        experts.zero_grad()
        xi, wi = x.clone().requires_grad_(), weights.clone().requires_grad_()
        y = experts(xi, indices, wi, dispatch)
        projection_loss(y).backward()
        results.append(
            (y.detach(), xi.grad, wi.grad, [p.grad.clone() for p in experts.parameters()])
        )
    (yg, xg, wg, pg), (yl, xl, wl, pl) = results
    assert yg.abs().max() > 1e-3
    torch.testing.assert_close(yg, yl, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(xg, xl, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(wg, wl, atol=1e-5, rtol=1e-5)
    for a, b in zip(pg, pl):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_grouped_mm_op_matches_float64_loop_forward_and_backward() -> None:
    """smelt::grouped_mm and its grouped backward against one float64 matmul per group,
    with an empty group and a group at each end."""
    gen = torch.Generator().manual_seed(0)
    sizes = [4, 0, 9, 3, 7]
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
    a = torch.randn(sum(sizes), 16, generator=gen).requires_grad_()
    b = torch.randn(len(sizes), 16, 12, generator=gen).requires_grad_()
    grad = torch.randn(sum(sizes), 12, generator=gen)
    y = grouped_mm(a, b, offs)
    y.backward(grad)

    a64, b64, g64 = a.detach().double(), b.detach().double(), grad.double()
    want_y, want_ga, want_gb = torch.zeros(sum(sizes), 12).double(), torch.zeros_like(a64), []
    start = 0
    for e, size in enumerate(sizes):
        rows = slice(start, start + size)
        want_y[rows] = a64[rows] @ b64[e]
        want_ga[rows] = g64[rows] @ b64[e].T
        want_gb.append(a64[rows].T @ g64[rows])  # zeros for the empty group
        start += size
    torch.testing.assert_close(y.double(), want_y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.grad.double(), want_ga, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.grad.double(), torch.stack(want_gb), atol=1e-5, rtol=1e-5)
    assert b.grad[1].abs().max() == 0
    # schema, fake (meta) rule and autograd registration agree with the real kernel
    torch.library.opcheck(grouped_mm, (a.detach(), b.detach().requires_grad_(), offs))


def test_grouped_mm_op_uses_the_private_kernel_where_torch_lacks_the_public_name(
    monkeypatch,
) -> None:
    """Without `F.grouped_mm` (a torch older than the pin) the op calls `torch._grouped_mm` and
    gives the same products, forward and backward."""
    gen = torch.Generator().manual_seed(1)
    offs = torch.tensor([3, 3, 8], dtype=torch.int32)
    a = torch.randn(8, 16, generator=gen, requires_grad=True)
    b = torch.randn(3, 16, 4, generator=gen, requires_grad=True)
    grad = torch.randn(8, 4, generator=gen)
    want = grouped_mm(a, b, offs)
    want_ga, want_gb = torch.autograd.grad(want, (a, b), grad)
    calls: list[int] = []
    private = torch._grouped_mm

    def spy(*args, **kwargs):
        calls.append(1)
        return private(*args, **kwargs)

    monkeypatch.delattr(F, "grouped_mm")
    monkeypatch.setattr(torch, "_grouped_mm", spy)
    got = grouped_mm(a, b, offs)
    got_ga, got_gb = torch.autograd.grad(got, (a, b), grad)
    assert len(calls) == 3  # forward, input gradient, weight gradient
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got_ga, want_ga, rtol=0, atol=0)
    torch.testing.assert_close(got_gb, want_gb, rtol=0, atol=0)


def test_loop_matches_hand_computed_experts() -> None:
    """The reference itself: out[i] = sum_j w_ij * SwiGLU_{e_ij}(x_i), token by token."""
    torch.manual_seed(0)
    experts = Experts(ModelConfig(d_model=8, d_expert=4, n_experts=3, top_k=2))
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(5, 8, dtype=torch.float64)
    indices, weights = _routing(5, 3, 2)
    y = experts.loop(x, indices, weights.double())
    for i in range(5):
        want = torch.zeros(8, dtype=torch.float64)
        for j in range(2):
            e = int(indices[i, j])
            g, u = x[i] @ experts.W_gate[e].double(), x[i] @ experts.W_up[e].double()
            want += weights[i, j].double() * (
                (g * torch.sigmoid(g) * u) @ experts.W_down[e].double()
            )
        torch.testing.assert_close(y[i], want)


def test_model_dispatches_agree_forward_and_grad(make_cfg, make_model, make_tokens) -> None:
    model = make_model(make_cfg(n_experts=8, top_k=3, init_std=0.1)).train()
    tokens = make_tokens(2, 12)
    grads, logits = [], []
    for dispatch in ("grouped", "loop"):
        model.set_dispatch(dispatch)
        model.zero_grad()
        out = model(tokens)
        (projection_loss(out) + model.aux_losses["load_balance"]).backward()
        logits.append(out.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4, msg=name)
    with pytest.raises(ValueError, match="dispatch"):
        model.set_dispatch("scatter")


def test_unaligned_widths_fall_back_to_loop(make_cfg, make_model, make_tokens, monkeypatch) -> None:
    model = make_model(make_cfg(d_model=30, d_expert=18))
    tokens = make_tokens(1, 6)
    with torch.no_grad():
        model.set_dispatch("loop")
        want = model(tokens)
        model.set_dispatch("grouped")

        def refuse(*args, **kwargs):
            raise AssertionError("grouped_mm called on unaligned rows")

        monkeypatch.setattr(moe_mod.F, "grouped_mm", refuse)
        torch.testing.assert_close(model(tokens), want)


def test_aligned_widths_use_grouped_mm(tiny_model, make_tokens, monkeypatch) -> None:
    calls: list[int] = []
    real = F.grouped_mm

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(moe_mod.F, "grouped_mm", spy)
    with torch.no_grad():
        tiny_model(make_tokens(1, 4))
    assert len(calls) == 2 * len(tiny_model.schedule)  # gate+up fused, then down


def test_routing_weights_renormalised(make_cfg, make_model, make_tokens) -> None:
    model = make_model(make_cfg(n_experts=8, top_k=3, init_std=0.2))
    _, cache = model.run_with_cache(make_tokens(2, 9))
    for layer, visit in model.schedule:
        logits = cache[hook_name(layer, visit, "moe.hook_router_logits")].double()
        idx = cache[hook_name(layer, visit, "moe.hook_expert_indices")]
        w = cache[hook_name(layer, visit, "moe.hook_expert_weights")].double()
        probs = logits.softmax(-1)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 9, dtype=torch.float64))
        for b in range(2):
            for t in range(9):
                ranked = sorted(range(8), key=lambda e: -float(probs[b, t, e]))[:3]
                assert idx[b, t].tolist() == ranked
                chosen = probs[b, t, ranked]
                torch.testing.assert_close(w[b, t], chosen / chosen.sum(), atol=1e-6, rtol=1e-5)


def _hand_losses(
    logits: torch.Tensor, indices: torch.Tensor, n_experts: int
) -> tuple[float, float]:
    """E * sum_e f_e P_e and mean(logsumexp^2) by plain Python loops."""
    n, k = indices.shape
    rows = logits.double().tolist()
    probs = [[math.exp(v) / sum(math.exp(u) for u in row) for v in row] for row in rows]
    f = [sum(int(i) == e for i in indices.reshape(-1)) / (n * k) for e in range(n_experts)]
    p = [sum(probs[t][e] for t in range(n)) / n for e in range(n_experts)]
    balance = n_experts * sum(f[e] * p[e] for e in range(n_experts))
    z = sum(math.log(sum(math.exp(u) for u in row)) ** 2 for row in rows) / n
    return balance, z


def test_router_losses_hand_cases() -> None:
    # uniform router, tokens split evenly over experts 0 and 1 (k = 1): E * (1/2 + 1/2) / E = 1
    logits = torch.zeros(4, 4)
    out = router_losses(logits, torch.tensor([[0], [1], [0], [1]]), 4)
    assert float(out.load_balance) == pytest.approx(1.0)
    assert float(out.z_loss) == pytest.approx(math.log(4) ** 2)
    # everything on expert 0 with P_0 = 0.7: 4 * 1 * 0.7
    logits = torch.log(torch.tensor([[0.7, 0.1, 0.1, 0.1]] * 3))
    out = router_losses(logits, torch.zeros(3, 1, dtype=torch.long), 4)
    assert float(out.load_balance) == pytest.approx(2.8)
    assert float(out.z_loss) == pytest.approx(0.0, abs=1e-6)  # logsumexp(log p) = 0


def test_router_losses_match_python_loops() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(20, 6, generator=gen) * 2
    indices = logits.topk(2, dim=-1).indices
    out = router_losses(logits, indices, 6)
    balance, z = _hand_losses(logits, indices, 6)
    assert float(out.load_balance) == pytest.approx(balance, rel=1e-5)
    assert float(out.z_loss) == pytest.approx(z, rel=1e-5)


def test_model_aux_losses_average_over_visits(make_cfg, make_model, make_tokens) -> None:
    model = make_model(make_cfg(n_experts=8, top_k=2, init_std=0.2))
    _, cache = model.run_with_cache(make_tokens(2, 7))
    per_visit = []
    for layer, visit in model.schedule:
        logits = cache[hook_name(layer, visit, "moe.hook_router_logits")].reshape(14, 8)
        idx = cache[hook_name(layer, visit, "moe.hook_expert_indices")].reshape(14, 2)
        per_visit.append(_hand_losses(logits, idx, 8))
    n = len(per_visit)
    assert float(model.aux_losses["load_balance"].detach()) == pytest.approx(
        sum(b for b, _ in per_visit) / n, rel=1e-5
    )
    assert float(model.aux_losses["z_loss"].detach()) == pytest.approx(
        sum(z for _, z in per_visit) / n, rel=1e-5
    )


def test_bf16_combine_sums_the_top_k_in_float32() -> None:
    """Eight identical experts, a token's eight routing weights summing to 1: summed in float32
    the bf16 output equals the one expert's output at weight 1, exactly; summed in bf16 (each
    weighted contribution and each partial sum rounded) 1.4% of the outputs differed, by up to
    0.03."""
    torch.manual_seed(0)
    n_experts = k = 8
    cfg = ModelConfig.smelt(
        d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_head=8, n_experts=n_experts,
        top_k=k, d_expert=32, max_seq_len=64,
    )  # fmt: skip
    experts = Experts(cfg)
    with torch.no_grad():
        for p in (experts.W_gate, experts.W_up, experts.W_down):
            p.copy_(torch.randn_like(p[0]).expand_as(p) * 0.3)
    x = torch.randn(64, 32).bfloat16()
    indices = torch.stack([torch.randperm(n_experts)[:k] for _ in range(64)])
    weights = torch.rand(64, k)
    weights = weights / weights.sum(-1, keepdim=True)
    with torch.no_grad():
        out = experts(x, indices, weights)
        alone = experts(x, indices[:, :1], torch.ones(64, 1))
    assert out.dtype == torch.bfloat16 and alone.abs().max() > 0.1
    assert torch.equal(out, alone)
