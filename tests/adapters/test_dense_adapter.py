"""The dense Llama-family adapter (llama, mistral) on tiny random models built offline, as it
is and looped at inference: hook points against HF's own eager attentions and hidden states,
every visit against a float64 forward written out here (RMSNorm, RoPE, GQA softmax attention
with the causal or sliding-window mask, SwiGLU) walking the same schedule, and the one-line
refusals of a loop."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers.tiny_looped import tiny_folder  # noqa: E402

from smelt_interp.adapters import adapt, load_looped  # noqa: E402
from smelt_interp.adapters.inference_loop import (  # noqa: E402
    Loop,
    ScheduledLayers,
    parse_loop,
    split_loop_name,
)
from smelt_interp.errors import CheckpointError  # noqa: E402
from smelt_interp.loading import load_model  # noqa: E402
from smelt_interp.model.protocol import hook_name  # noqa: E402

VOCAB, T, N_LAYERS, WINDOW = 64, 9, 4, 4
DENSE = ("llama", "mistral")


def dense_config(arch: str) -> Any:
    """4 layers, GQA (4 query heads on 2 key/value heads of 8), mistral with a window of 4."""
    common = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=N_LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    if arch == "mistral":
        return transformers.MistralConfig(sliding_window=WINDOW, **common)
    return transformers.LlamaConfig(**common)


def dense_model(arch: str, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(dense_config(arch)).eval()


TOKENS = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(3))


# ----- the float64 reference -------------------------------------------------------------------
def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate [b, H, T, d] by position, halves paired as Llama pairs them."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(x.shape[2], dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + half * sin


def reference(hf: Any, tokens: torch.Tensor, schedule: tuple) -> dict[str, Any]:
    """Float64 logits and, per (layer, visit): post-RoPE q [b, T, H, d], the pattern
    [b, H, T, T] and the residual after the layer, walking `schedule` over hf's layers."""
    cfg = hf.config
    sd = {k: v.double() for k, v in hf.state_dict().items()}
    H, Hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    theta = cfg.rope_parameters["rope_theta"]
    b, T = tokens.shape
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    allowed = (j <= i) & ((i - j < cfg.sliding_window) if getattr(cfg, "sliding_window", None)
                          else torch.ones(T, T, dtype=torch.bool))  # fmt: skip
    h = sd["model.embed_tokens.weight"][tokens]
    out: dict[str, Any] = {"visits": {}}
    for layer, visit in schedule:
        w = lambda name: sd[f"model.layers.{layer}.{name}"]  # noqa: E731
        x = rms(h, w("input_layernorm.weight"), cfg.rms_norm_eps)
        q = (x @ w("self_attn.q_proj.weight").T).view(b, T, H, d).transpose(1, 2)
        k = (x @ w("self_attn.k_proj.weight").T).view(b, T, Hkv, d).transpose(1, 2)
        v = (x @ w("self_attn.v_proj.weight").T).view(b, T, Hkv, d).transpose(1, 2)
        q, k = rope(q, theta), rope(k, theta)
        k, v_rep = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        logits = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~allowed, -math.inf)
        pattern = logits.softmax(-1)
        z = (pattern @ v_rep).transpose(1, 2).reshape(b, T, H * d)
        h = h + z @ w("self_attn.o_proj.weight").T
        x = rms(h, w("post_attention_layernorm.weight"), cfg.rms_norm_eps)
        gate = torch.nn.functional.silu(x @ w("mlp.gate_proj.weight").T)
        h = h + (gate * (x @ w("mlp.up_proj.weight").T)) @ w("mlp.down_proj.weight").T
        out["visits"][(layer, visit)] = (q.transpose(1, 2), pattern, h)
    final = rms(h, sd["model.norm.weight"], cfg.rms_norm_eps)
    out["logits"] = final @ sd["lm_head.weight"].T
    return out


# ----- unlooped: against HF's own outputs -----------------------------------------------------
@pytest.mark.parametrize("arch", DENSE)
def test_unlooped_hooks_equal_hf_eager_attentions_and_hidden_states(arch: str) -> None:
    hf = dense_model(arch)
    plain = copy.deepcopy(hf)
    plain.config._attn_implementation = "eager"
    with torch.no_grad():
        want = plain(
            input_ids=TOKENS, output_attentions=True, output_hidden_states=True, use_cache=False
        )
        sdpa = copy.deepcopy(hf)(input_ids=TOKENS, use_cache=False).logits
    adapter = adapt(hf)
    assert adapter.schedule == tuple((n, 0) for n in range(N_LAYERS))
    assert not adapter.cfg.is_looped and adapter.cfg.n_kv_heads == 2 and adapter.cfg.d_head == 8
    logits, cache = adapter.run_with_cache(TOKENS)
    torch.testing.assert_close(logits, want.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, sdpa, atol=1e-5, rtol=1e-5)
    for n in range(N_LAYERS):
        pattern = cache[hook_name(n, 0, "attn.hook_pattern")]
        torch.testing.assert_close(pattern, want.attentions[n], atol=1e-6, rtol=1e-5)
        pre = cache[hook_name(n, 0, "hook_resid_pre")]
        torch.testing.assert_close(pre, want.hidden_states[n], atol=1e-6, rtol=1e-5)
        parts = sum(cache[hook_name(n, 0, w)] for w in ("hook_attn_out", "hook_mlp_out"))
        torch.testing.assert_close(pre + parts, cache[hook_name(n, 0, "hook_resid_post")])
    if arch == "mistral":  # the window holds: query 8 does not see key 4
        assert cache[hook_name(0, 0, "attn.hook_pattern")][:, :, 8, 4].abs().max() == 0


# ----- looped and unlooped: against the float64 loop -----------------------------------------
@pytest.mark.parametrize("arch", DENSE)
@pytest.mark.parametrize("loop", [None, Loop(1, 3), Loop(0, 4, 3), Loop(2, 3, 2)])
def test_every_visit_equals_a_float64_loop(arch: str, loop: Loop | None) -> None:
    hf = dense_model(arch)
    want = reference(copy.deepcopy(hf), TOKENS, loop.schedule(N_LAYERS) if loop else
                     tuple((n, 0) for n in range(N_LAYERS)))  # fmt: skip
    adapter = adapt(hf, loop=loop)
    assert adapter.schedule == tuple(want["visits"])
    logits, cache = adapter.run_with_cache(TOKENS)
    torch.testing.assert_close(logits.double(), want["logits"], atol=1e-4, rtol=1e-4)
    for (layer, visit), (q, pattern, post) in want["visits"].items():
        got_q = cache[hook_name(layer, visit, "attn.hook_q")].double()
        torch.testing.assert_close(got_q, q, atol=1e-5, rtol=1e-4)
        got = cache[hook_name(layer, visit, "attn.hook_pattern")].double()
        torch.testing.assert_close(got, pattern, atol=1e-5, rtol=1e-4)
        first = got[:, :, 1:, 0].mean(dim=(0, 2))  # per head: first-token mass of queries 1..
        torch.testing.assert_close(first, pattern[:, :, 1:, 0].mean(dim=(0, 2)), atol=1e-6, rtol=0)
        got_post = cache[hook_name(layer, visit, "hook_resid_post")].double()
        torch.testing.assert_close(got_post, post, atol=1e-4, rtol=1e-4)
    if loop is not None:
        cfg = adapter.cfg
        assert cfg.looped_layers == tuple(range(loop.start, loop.end))
        assert cfg.effective_depth == N_LAYERS + (loop.repeats - 1) * (loop.end - loop.start)
        assert cfg.name == f"{arch}@{loop.text}"
        # each visit fired once, with its own values
        a = cache[hook_name(loop.start, 0, "hook_resid_post")]
        assert not torch.allclose(a, cache[hook_name(loop.start, 1, "hook_resid_post")])


@pytest.mark.parametrize("loop", [None, Loop(1, 3)])
def test_greedy_decoding_follows_the_float64_loop(loop: Loop | None) -> None:
    """generate reads only the last position's logits (logits_to_keep); each new token is the
    argmax of the float64 forward over the whole prefix."""
    hf = dense_model("llama", seed=1)
    schedule = loop.schedule(N_LAYERS) if loop else tuple((n, 0) for n in range(N_LAYERS))
    reference_hf = copy.deepcopy(hf)
    adapter = adapt(hf, loop=loop)
    assert adapter._keeps_last_logits()
    got = adapter.generate(TOKENS, max_new_tokens=5)
    want = TOKENS
    for _ in range(5):
        logits = reference(reference_hf, want, schedule)["logits"][:, -1]
        want = torch.cat([want, logits.argmax(dim=-1, keepdim=True)], dim=1)
    assert torch.equal(got, want)


def test_the_loop_reuses_the_layer_modules() -> None:
    hf = dense_model("llama")
    keys = set(hf.state_dict())
    n_params = sum(p.numel() for p in hf.parameters())
    adapter = adapt(hf, loop=Loop(1, 3, 3))
    assert isinstance(hf.model.layers, ScheduledLayers) and len(hf.model.layers) == N_LAYERS
    assert set(hf.state_dict()) == keys
    assert sum(p.numel() for p in adapter.parameters()) == n_params
    walked = hf.model.layers[:N_LAYERS]
    assert [id(m) for m in walked] == [id(hf.model.layers[n]) for n, _ in adapter.schedule]


# ----- naming and refusals ----------------------------------------------------------------------
def test_loop_spans_parse_and_name() -> None:
    assert parse_loop("12:18") == Loop(12, 18, 2) and parse_loop("8:22x3") == Loop(8, 22, 3)
    assert Loop(12, 18).schedule(20)[11:14] == ((11, 0), (12, 0), (13, 0))
    assert split_loop_name("models/x@12:18x2") == (Path("models/x"), Loop(12, 18, 2))
    assert split_loop_name("models/x@y") == (Path("models/x@y"), None)
    for bad in ("12", "12:18x", "a:b", "-1:3"):
        with pytest.raises(ValueError, match="START:END"):
            parse_loop(bad)


@pytest.mark.parametrize(
    ("span", "message"),
    [("2:9", "past the model's 4 layers"), ("3:3", "empty"), ("3:1", "empty"),
     ("1:3x1", "at least twice")],
)  # fmt: skip
def test_a_bad_span_is_one_line(span: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=message) as info:
        adapt(dense_model("llama"), name="tiny", loop=parse_loop(span))
    assert "\n" not in str(info.value)


def test_a_model_that_loops_already_is_refused(tmp_path: Path) -> None:
    folder = tiny_folder(tmp_path, "hrm_text")
    with pytest.raises(CheckpointError, match="loops already by its own config") as info:
        load_looped(folder, loop=Loop(0, 2))
    assert "\n" not in str(info.value)


def test_load_model_takes_the_loop_as_a_flag_or_in_the_name(tmp_path: Path) -> None:
    folder = tmp_path / "tiny-llama"
    dense_model("llama").save_pretrained(folder)
    flag, _ = load_model(folder, "cpu", loop="1:3x3")
    named, info = load_model(f"{folder}@1:3x3", "cpu")
    plain, _ = load_model(folder, "cpu")
    assert flag.cfg.schedule == named.cfg.schedule == Loop(1, 3, 3).schedule(N_LAYERS)
    assert named.cfg.name == "tiny-llama@1:3x3" and info.path == folder
    with torch.no_grad():
        torch.testing.assert_close(flag(TOKENS), named(TOKENS), atol=0, rtol=0)
        assert not torch.allclose(flag(TOKENS), plain(TOKENS))
    with pytest.raises(CheckpointError, match="one only"):
        load_model(f"{folder}@1:3x3", "cpu", loop="1:3x2")
    with pytest.raises(CheckpointError, match="START:END"):
        load_model(folder, "cpu", loop="1-3")
    with pytest.raises(CheckpointError, match="transformers folder of a dense model"):
        load_model(tmp_path / "ckpt.pt", "cpu", loop="1:3")
