"""Attention: the fused SDPA path and the explicit path agree (GQA included, with and without
the KV cache); the explicit path runs only where asked; the pattern is a causal softmax that
probes can recompute from the cached post-RoPE q and k; RoPE against its complex definition."""

from __future__ import annotations

import math

import pytest
import torch

from smelt_interp.model import attention as attention_mod
from smelt_interp.model.kv_cache import KVCache
from smelt_interp.model.protocol import hook_name
from smelt_interp.model.rope import Rotary, apply_rotary

GQA = [(4, 4), (4, 2), (4, 1)]


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("n_heads, n_kv_heads", GQA)
def test_sdpa_matches_explicit(make_cfg, make_model, make_tokens, n_heads, n_kv_heads) -> None:
    model = make_model(make_cfg(n_heads=n_heads, n_kv_heads=n_kv_heads, init_std=0.1))
    tokens = make_tokens(2, 24)
    z_only = lambda name: name.endswith("hook_z")  # noqa: E731  (leaves hook_pattern unhooked)
    with torch.no_grad():
        fused, fused_cache = model.run_with_cache(tokens, names_filter=z_only)
        with model.explicit_attention():
            explicit, explicit_cache = model.run_with_cache(tokens, names_filter=z_only)
    assert _max_diff(fused, explicit) < 1e-5
    assert set(fused_cache) == set(model.hook_names("attn.hook_z"))
    for name in fused_cache:
        assert _max_diff(fused_cache[name], explicit_cache[name]) < 1e-5


@pytest.mark.parametrize("n_heads, n_kv_heads", GQA)
@pytest.mark.parametrize("explicit", [False, True])
def test_kv_cache_matches_full_forward(
    make_cfg, make_model, make_tokens, n_heads, n_kv_heads, explicit
) -> None:
    """Prefill 5, then a 4-token chunk (q_len > 1 with a past), then single steps."""
    model = make_model(make_cfg(n_heads=n_heads, n_kv_heads=n_kv_heads, init_std=0.1))
    tokens = make_tokens(2, 14)
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache()
        with model.explicit_attention() if explicit else torch.no_grad():
            parts = [model(tokens[:, :5], cache=cache), model(tokens[:, 5:9], cache=cache)]
            parts += [model(tokens[:, i : i + 1], cache=cache) for i in range(9, 14)]
    assert _max_diff(torch.cat(parts, dim=1), full) < 1e-5
    assert set(cache.keys()) == set(model.schedule)  # one entry per (layer, visit)
    assert cache.seq_len == 14


def test_only_the_hooked_visit_takes_the_explicit_path(
    tiny_model, make_tokens, monkeypatch
) -> None:
    calls: list[int] = []
    original = attention_mod.Attention._explicit

    def spy(self, q, k, v, hooks, hidden):
        calls.append(1)
        return original(self, q, k, v, hooks, hidden)

    monkeypatch.setattr(attention_mod.Attention, "_explicit", spy)
    tokens = make_tokens(1, 6)
    fired: list[tuple] = []
    with torch.no_grad():
        tiny_model(tokens)
        assert calls == []
        tiny_model.run_with_hooks(
            tokens,
            fwd_hooks=[
                (hook_name(1, 1, "attn.hook_pattern"), lambda t, hook: fired.append(t.shape))
            ],
        )
        assert len(calls) == 1 and fired == [(1, 4, 6, 6)]
        calls.clear()
        with tiny_model.explicit_attention(visits=[(1, 0), (2, 1)]):
            tiny_model(tokens)
        assert len(calls) == 2
        calls.clear()
        tiny_model(tokens)  # the forcing flag is reset on exit
        assert calls == []


@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_pattern_is_causal_softmax_recomputable_from_q_k(
    make_cfg, make_model, make_tokens, n_kv_heads
) -> None:
    model = make_model(make_cfg(n_kv_heads=n_kv_heads, init_std=0.1))
    cfg = model.cfg
    _, cache = model.run_with_cache(make_tokens(2, 10))
    for layer, visit in cfg.schedule:
        pattern = cache[hook_name(layer, visit, "attn.hook_pattern")].double()
        q = cache[hook_name(layer, visit, "attn.hook_q")].double()
        k = cache[hook_name(layer, visit, "attn.hook_k")].double()
        v = cache[hook_name(layer, visit, "attn.hook_v")].double()
        z = cache[hook_name(layer, visit, "attn.hook_z")].double()
        torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern.sum(-1)))
        assert torch.all(pattern.triu(diagonal=1) == 0)
        # recompute head by head, key head = head // group
        for head in range(cfg.n_heads):
            kv = head // cfg.n_group
            scores = q[:, :, head] @ k[:, :, kv].transpose(1, 2) / math.sqrt(cfg.d_head)
            scores = scores.masked_fill(torch.ones(10, 10).triu(1).bool(), float("-inf"))
            want = torch.softmax(scores, dim=-1)
            torch.testing.assert_close(pattern[:, head], want, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(z[:, :, head], want @ v[:, :, kv], atol=1e-6, rtol=1e-5)


def test_rotary_matches_complex_definition_and_is_relative() -> None:
    d, theta = 8, 10000.0
    rot = Rotary(d, 32, theta)
    x = torch.randn(1, 32, 3, d, dtype=torch.float64)
    got = rot(x.float()).double()
    # rotate-half layout: pair i is (x[i], x[i + d/2]) as one complex number
    half = d // 2
    z = torch.complex(x[..., :half], x[..., half:])
    freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / d)
    angles = torch.arange(32, dtype=torch.float64)[:, None] * freq
    w = z * torch.polar(torch.ones_like(angles), angles)[None, :, None, :]
    want = torch.cat([w.real, w.imag], dim=-1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # offset: positions 5.. of a sequence equal the sequence rotated from offset 5
    torch.testing.assert_close(rot(x[:, 5:9].float(), offset=5), rot(x.float())[:, 5:9])
    # q . k depends only on the relative offset
    q, k = torch.randn(1, 1, 1, d), torch.randn(1, 1, 1, d)
    dots = [
        float((rot(q.expand(1, 32, 1, d))[0, m] * rot(k.expand(1, 32, 1, d))[0, n]).sum())
        for m, n in ((3, 1), (10, 8), (30, 28))
    ]
    assert max(dots) - min(dots) < 1e-5


def test_rotary_roll_form_equals_the_rotate_half_form_bitwise() -> None:
    """apply_rotary's roll with the sign folded into sin gives exactly the floats of the plain
    rotate-half form x * cos + cat(-x2, x1) * sin, forward and gradient (odd half width too)."""
    for d in (8, 22):
        rot = Rotary(d, 64, 10000.0)
        tables = rot.tables(3, 40)
        x = torch.randn(2, 40, 3, d, requires_grad=True)
        grad_out = torch.randn(2, 40, 3, d)
        got = apply_rotary(x, tables)
        (got_grad,) = torch.autograd.grad(got, x, grad_out)
        half = d // 2
        sin = torch.cat([-tables.signed_sin[..., :half], tables.signed_sin[..., half:]], dim=-1)
        want = x * tables.cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin
        (want_grad,) = torch.autograd.grad(want, x, grad_out)
        assert torch.equal(got, want) and torch.equal(got_grad, want_grad)


def test_causal_mask_for_queries_at_the_end() -> None:
    mask = attention_mod.causal_mask(2, 4, torch.device("cpu"))
    assert mask.tolist() == [[True, True, True, False], [True, True, True, True]]
