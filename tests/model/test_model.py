"""The transformer against its contracts: every DESIGN.md hook point at each visit, firing once,
readable through run_with_cache and nnsight; the 1/r scaling and schedule order checked by hand;
and an independent float64 reference forward written from scratch below."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from smelt_interp.config import ModelConfig
from smelt_interp.errors import TokenError, TokenizerError
from smelt_interp.model.attention import AttentionHooks
from smelt_interp.model.moe import MoEHooks
from smelt_interp.model.protocol import VISIT_HOOKS, hook_name
from smelt_interp.model.transformer import SmeltModel, next_token_ce

# DESIGN.md's table: name -> (shape as a function of batch b, pos t, cfg c; integer dtype?)
SHAPES: dict[str, Callable[[int, int, ModelConfig], tuple[int, ...]]] = {
    "hook_resid_pre": lambda b, t, c: (b, t, c.d_model),
    "attn.hook_q": lambda b, t, c: (b, t, c.n_heads, c.d_head),
    "attn.hook_k": lambda b, t, c: (b, t, c.n_kv_heads, c.d_head),
    "attn.hook_v": lambda b, t, c: (b, t, c.n_kv_heads, c.d_head),
    "attn.hook_pattern": lambda b, t, c: (b, c.n_heads, t, t),
    "attn.hook_z": lambda b, t, c: (b, t, c.n_heads, c.d_head),
    "hook_attn_out": lambda b, t, c: (b, t, c.d_model),
    "hook_resid_mid": lambda b, t, c: (b, t, c.d_model),
    "moe.hook_router_logits": lambda b, t, c: (b, t, c.n_experts),
    "moe.hook_expert_indices": lambda b, t, c: (b, t, c.top_k),
    "moe.hook_expert_weights": lambda b, t, c: (b, t, c.top_k),
    "hook_mlp_out": lambda b, t, c: (b, t, c.d_model),
    "hook_resid_post": lambda b, t, c: (b, t, c.d_model),
}


def test_visit_hook_list_matches_design() -> None:
    assert set(VISIT_HOOKS) == set(SHAPES)
    assert hook_name(2, 1, "attn.hook_q") == "blocks.2.visits.1.attn.hook_q"
    assert SmeltModel.hook_name(0, 0, "hook_mlp_out") == "blocks.0.visits.0.hook_mlp_out"
    with pytest.raises(KeyError, match="hook_nope"):
        hook_name(0, 0, "hook_nope")


def test_every_hook_point_exists_with_shape_and_dtype(tiny_model, make_tokens) -> None:
    cfg = tiny_model.cfg
    tokens = make_tokens(2, 7)
    _, cache = tiny_model.run_with_cache(tokens)
    expected = {hook_name(l, v, n) for l, v in cfg.schedule for n in VISIT_HOOKS}
    expected |= {"hook_embed", "hook_resid_final"}
    assert set(cache) == expected
    assert set(tiny_model.hook_dict) == expected
    for layer, visit in cfg.schedule:
        for name, shape in SHAPES.items():
            t = cache[hook_name(layer, visit, name)]
            assert tuple(t.shape) == shape(2, 7, cfg), name
            if name == "moe.hook_expert_indices":
                assert not t.dtype.is_floating_point and not t.dtype.is_complex
            else:
                assert t.dtype == torch.float32, name
    for name in ("hook_embed", "hook_resid_final"):
        assert tuple(cache[name].shape) == (2, 7, cfg.d_model)


def test_looped_layers_have_one_visit_each(tiny_model) -> None:
    cfg = tiny_model.cfg
    assert tiny_model.schedule == cfg.schedule == ((0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (3, 0))
    for layer in range(cfg.n_layers):
        assert len(tiny_model.blocks[layer].visits) == cfg.visits_of(layer)
    assert hook_name(0, 1, "hook_resid_pre") not in tiny_model.hook_dict
    assert hook_name(3, 1, "hook_resid_pre") not in tiny_model.hook_dict
    assert hook_name(1, 1, "hook_resid_pre") in tiny_model.hook_dict
    assert tiny_model.hook_names("hook_mlp_out") == [
        f"blocks.{l}.visits.{v}.hook_mlp_out" for l, v in cfg.schedule
    ]


def test_each_hook_point_fires_exactly_once(tiny_model, make_tokens) -> None:
    counts = {name: 0 for name in tiny_model.hook_dict}

    def counter(name: str) -> Callable:
        def hook(tensor: torch.Tensor, hook) -> None:
            counts[name] += 1

        return hook

    tiny_model.run_with_hooks(
        make_tokens(1, 5), fwd_hooks=[(name, counter(name)) for name in counts]
    )
    assert len(counts) == 13 * len(tiny_model.schedule) + 2
    assert all(c == 1 for c in counts.values()), {n: c for n, c in counts.items() if c != 1}
    # and nothing is left attached afterwards (the fused path is back)
    assert not any(hp._forward_hooks for hp in tiny_model.hook_dict.values())


def test_run_with_cache_separates_visits(tiny_model, make_tokens) -> None:
    _, cache = tiny_model.run_with_cache(make_tokens(2, 9))
    for name in VISIT_HOOKS:
        if name == "moe.hook_expert_indices":
            continue
        a, b = cache[hook_name(1, 0, name)], cache[hook_name(1, 1, name)]
        assert not torch.allclose(a, b), name
    # visit 1 of layer 1 reads the residual visit 0 of layer 2 wrote
    assert torch.equal(
        cache[hook_name(1, 1, "hook_resid_pre")], cache[hook_name(2, 0, "hook_resid_post")]
    )


def test_hook_points_are_parameter_free(make_cfg, make_model) -> None:
    smelt = make_model(make_cfg(looped=True))
    base = make_model(make_cfg(looped=False))
    keys = list(smelt.state_dict())
    assert keys == list(base.state_dict())
    assert not any("hook" in k or "visits" in k for k in keys)
    for hp in smelt.hook_dict.values():
        assert not list(hp.parameters()) and not list(hp.buffers())
    for mod in smelt.modules():
        if isinstance(mod, (AttentionHooks, MoEHooks)):
            assert not list(mod.parameters())
    # weights live once: the same tensors whatever the number of visits
    assert sum(p.numel() for p in smelt.parameters()) == sum(p.numel() for p in base.parameters())


def test_nnsight_reads_each_visit(tiny_model, make_tokens, monkeypatch) -> None:
    nnsight = pytest.importorskip("nnsight")
    from nnsight.schema.config import CONFIG

    monkeypatch.setattr(CONFIG.APP, "DEBUG", False)  # `pytest -v` would switch it on
    tokens = make_tokens(2, 8)
    names = ("attn.hook_q", "attn.hook_v", "moe.hook_expert_indices", "hook_mlp_out")
    nm = nnsight.NNsight(tiny_model)
    saved = {}
    with nm.trace(tokens):
        for visit in (0, 1):
            hooks = nm.blocks[2].visits[visit]
            saved[visit] = {
                "attn.hook_q": hooks.attn.hook_q.output.save(),
                "attn.hook_v": hooks.attn.hook_v.output.save(),
                "moe.hook_expert_indices": hooks.moe.hook_expert_indices.output.save(),
                "hook_mlp_out": hooks.hook_mlp_out.output.save(),
            }
    _, cache = tiny_model.run_with_cache(tokens)
    for name in names:
        for visit in (0, 1):
            got, want = saved[visit][name], cache[hook_name(2, visit, name)]
            assert got.shape == want.shape
            torch.testing.assert_close(got.detach(), want, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(saved[0]["attn.hook_q"], saved[1]["attn.hook_q"])


# ----- the 1/r scaling and the schedule order, by hand -------------------------------------
def test_residual_writes_scaled_by_one_over_r(make_cfg, make_model, make_tokens) -> None:
    cfg = make_cfg(n_loops=3, init_std=0.1)
    model = make_model(cfg)
    tokens = make_tokens(2, 6)
    _, cache = model.run_with_cache(tokens)
    for layer, visit in cfg.schedule:
        block = model.blocks[layer]
        get = lambda n: cache[hook_name(layer, visit, n)].double()  # noqa: E731
        pre, mid, post = get("hook_resid_pre"), get("hook_resid_mid"), get("hook_resid_post")
        torch.testing.assert_close(mid - pre, get("hook_attn_out"), atol=1e-6, rtol=0)
        torch.testing.assert_close(post - mid, get("hook_mlp_out"), atol=1e-6, rtol=0)
        r = cfg.visits_of(layer)
        assert r == (3 if layer in (1, 2) else 1)
        with torch.no_grad():
            pre32 = cache[hook_name(layer, visit, "hook_resid_pre")]
            raw_attn = block.attn(block.ln_attn(pre32), AttentionHooks(), model.rotary)
            mid32 = cache[hook_name(layer, visit, "hook_resid_mid")]
            raw_mlp, _ = block.moe(block.ln_mlp(mid32), MoEHooks())
        torch.testing.assert_close(
            get("hook_attn_out"), raw_attn.double() / r, atol=1e-6, rtol=1e-5
        )
        torch.testing.assert_close(get("hook_mlp_out"), raw_mlp.double() / r, atol=1e-6, rtol=1e-5)
    # schedule order: each step reads what the step before it wrote
    steps = cfg.schedule
    assert torch.equal(cache[hook_name(*steps[0], "hook_resid_pre")], cache["hook_embed"])
    for before, after in zip(steps, steps[1:]):
        assert torch.equal(
            cache[hook_name(*after, "hook_resid_pre")], cache[hook_name(*before, "hook_resid_post")]
        )


# ----- an independent float64 reference -----------------------------------------------------
def reference_forward(model: SmeltModel, tokens: torch.Tensor) -> torch.Tensor:
    """Slow float64 forward: plain loops over the schedule, explicit softmax attention with
    repeated K/V heads, RoPE from its definition, and a per-token loop over chosen experts."""
    cfg = model.cfg
    W = {k: v.detach().double() for k, v in model.state_dict().items()}

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.norm_eps) * w

    def rope(x: torch.Tensor) -> torch.Tensor:  # x [t, heads, d_head]
        half = cfg.d_head // 2
        out = torch.empty_like(x)
        for pos in range(x.shape[0]):
            for i in range(half):
                angle = pos * cfg.rope_theta ** (-2 * i / cfg.d_head)
                c, s = math.cos(angle), math.sin(angle)
                a, b = x[pos, :, i], x[pos, :, i + half]
                out[pos, :, i], out[pos, :, i + half] = a * c - b * s, b * c + a * s
        return out

    logits = []
    for seq in tokens:
        t = seq.shape[0]
        x = W["embed.weight"][seq]
        for layer, _visit in cfg.schedule:
            p = f"blocks.{layer}."
            scale = 1.0 / cfg.visits_of(layer)
            h = rms(x, W[p + "ln_attn.weight"])
            q = rope((h @ W[p + "attn.W_q.weight"].T).view(t, cfg.n_heads, cfg.d_head))
            k = rope((h @ W[p + "attn.W_k.weight"].T).view(t, cfg.n_kv_heads, cfg.d_head))
            v = (h @ W[p + "attn.W_v.weight"].T).view(t, cfg.n_kv_heads, cfg.d_head)
            z = torch.zeros(t, cfg.n_heads, cfg.d_head, dtype=torch.float64)
            for head in range(cfg.n_heads):
                kv = head // cfg.n_group
                for i in range(t):
                    scores = torch.stack([q[i, head] @ k[j, kv] for j in range(i + 1)])
                    scores = scores / math.sqrt(cfg.d_head)
                    w = torch.exp(scores - scores.max())
                    w = w / w.sum()
                    z[i, head] = (w[:, None] * v[: i + 1, kv]).sum(0)
            x = x + scale * (z.reshape(t, -1) @ W[p + "attn.W_o.weight"].T)
            h = rms(x, W[p + "ln_mlp.weight"])
            probs = torch.softmax(h @ W[p + "moe.router.weight"].T, dim=-1)
            y = torch.zeros_like(x)
            for i in range(t):
                chosen = sorted(range(cfg.n_experts), key=lambda e: -float(probs[i, e]))[
                    : cfg.top_k
                ]
                total = sum(float(probs[i, e]) for e in chosen)
                for e in chosen:
                    g = h[i] @ W[p + "moe.experts.W_gate"][e]
                    u = h[i] @ W[p + "moe.experts.W_up"][e]
                    act = g / (1 + torch.exp(-g)) * u
                    y[i] += float(probs[i, e]) / total * (act @ W[p + "moe.experts.W_down"][e])
            x = x + scale * y
        logits.append(rms(x, W["ln_final.weight"]) @ W["unembed.weight"].T)
    return torch.stack(logits)


@pytest.mark.parametrize("n_kv_heads, n_loops", [(2, 2), (1, 3)])
def test_matches_float64_reference(make_cfg, make_model, make_tokens, n_kv_heads, n_loops) -> None:
    cfg = make_cfg(
        n_kv_heads=n_kv_heads, n_loops=n_loops, init_std=0.15, n_layers=3, n_experts=6, top_k=3
    )
    model = make_model(cfg)
    tokens = make_tokens(2, 6)
    ref = reference_forward(model, tokens)
    with torch.no_grad():
        got32 = model(tokens)
        got64 = model.double()(tokens)  # float64 falls back to the loop dispatch
    assert ref.abs().max() > 0.1  # the reference is not trivially tiny
    # float64 model: RoPE tables are stored in float32 and the router softmax runs in float32,
    # so agreement is ~1e-8, still far tighter than the float32 model's
    torch.testing.assert_close(got64, ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got32.double(), ref, atol=2e-5, rtol=1e-4)


def test_baseline_matches_reference(make_cfg, make_model, make_tokens) -> None:
    model = make_model(make_cfg(looped=False, init_std=0.15, n_layers=2)).double()
    tokens = make_tokens(1, 5)
    with torch.no_grad():
        torch.testing.assert_close(
            model(tokens), reference_forward(model, tokens), atol=1e-6, rtol=1e-5
        )


# ----- token validation ------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad, needle",
    [
        (torch.tensor([[1, 2, 259]]), "0..258"),
        (torch.tensor([[-1, 2, 3]]), "0..258"),
        (torch.zeros(1, 65, dtype=torch.long), "max_seq_len"),
        (torch.zeros(1, 3), "integer"),
        (torch.zeros(1, 2, 3, dtype=torch.long), "integer"),
    ],
)
def test_bad_tokens_raise_one_line(tiny_model, bad: torch.Tensor, needle: str) -> None:
    with pytest.raises(TokenError) as info:
        tiny_model(bad)
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, ValueError) and not isinstance(info.value, TokenizerError)


def test_one_dimensional_tokens_are_a_batch_of_one(tiny_model, make_tokens) -> None:
    tokens = make_tokens(1, 5)
    with torch.no_grad():
        assert torch.equal(tiny_model(tokens[0]), tiny_model(tokens))
        assert tiny_model(tokens.int()).shape == (1, 5, tiny_model.cfg.vocab_size)


# ----- the loss ---------------------------------------------------------------------------
def test_next_token_ce_per_token_against_log_softmax() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, 7, (2, 5), generator=gen)
    valid = torch.ones(2, 5, dtype=torch.bool)
    valid[1, 3:] = False
    ce = next_token_ce(logits, tokens, valid)
    assert ce.shape == (2, 4) and ce.dtype == torch.float64
    for b in range(2):
        for i in range(4):
            want = -torch.log_softmax(logits[b, i], -1)[tokens[b, i + 1]]
            assert ce[b, i] == (pytest.approx(float(want)) if valid[b, i + 1] else 0.0)
    assert torch.equal(next_token_ce(logits, tokens)[0], ce[0])  # default: every target counts
    half = next_token_ce(logits.to(torch.bfloat16), tokens, valid)
    assert half.dtype == torch.float32  # low-precision logits are scored in float32
