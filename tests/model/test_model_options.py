"""The model options that only the attention-sink control uses (learned absolute positions,
LayerNorm): off by default, so every existing model keeps its parameters and its forward pass."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from smelt_interp.config import ModelConfig
from smelt_interp.errors import ConfigError
from smelt_interp.model.rope import apply_rotary
from smelt_interp.model.transformer import SmeltModel

SMALL = dict(
    d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_head=8, n_experts=2, top_k=1, d_expert=16
)
OPTIONS = [
    {},
    {"positions": "learned"},
    {"norm": "layer"},
    {"positions": "learned", "norm": "layer"},
]


def model_of(**fields) -> SmeltModel:
    torch.manual_seed(0)
    return SmeltModel(ModelConfig.baseline(**SMALL, max_seq_len=32, **fields)).eval()


def test_defaults_add_no_parameter():
    cfg = ModelConfig()
    assert (cfg.positions, cfg.norm) == ("rope", "rms")
    names = set(model_of().state_dict())
    assert not any("pos_embed" in n or n.endswith(".bias") for n in names)


@pytest.mark.parametrize("fields", OPTIONS)
def test_n_params_counts_every_parameter(fields):
    model = model_of(**fields)
    assert model.cfg.n_params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("fields", [{"positions": "alibi"}, {"norm": "batch"}])
def test_unknown_option_is_refused(fields):
    with pytest.raises(ConfigError, match="must be one of"):
        ModelConfig(**fields)


def first_query(model: SmeltModel, tokens: torch.Tensor) -> torch.Tensor:
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("0.attn.hook_q"))
    return cache["blocks.0.visits.0.attn.hook_q"]


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_positions_enter_as_the_option_says(positions):
    """Layer 0's queries recomputed by hand: RoPE rotates W_q(norm(embed)); learned positions
    add their embedding to the token's before the norm and rotate nothing."""
    model = model_of(positions=positions)
    with torch.no_grad():  # a learned embedding starts near zero: make it count
        if model.pos_embed is not None:
            model.pos_embed.weight.normal_()
    tokens = torch.randint(0, 256, (2, 12))
    x = model.embed(tokens)
    if positions == "learned":
        x = x + model.pos_embed.weight[:12]
    block = model.blocks[0]
    q = block.attn.W_q(block.ln_attn(x)).view(2, 12, 2, 8)
    if positions == "rope":
        q = apply_rotary(q, model.rotary.tables(0, 12))
    torch.testing.assert_close(first_query(model, tokens), q)


def test_layer_norm_centres_and_starts_with_a_zero_bias():
    model = model_of(norm="layer")
    norm = model.blocks[0].ln_attn
    assert isinstance(norm, torch.nn.LayerNorm) and not norm.bias.any()
    x = torch.randn(3, 16) * 5 + 2
    reference = (x - x.mean(-1, keepdim=True)) / torch.sqrt(
        x.var(-1, unbiased=False, keepdim=True) + 1e-6
    )
    torch.testing.assert_close(norm(x), reference)
    torch.testing.assert_close(norm(x), F.layer_norm(x, (16,), eps=1e-6))


@pytest.mark.parametrize("fields", OPTIONS[1:])
def test_cached_decoding_matches_recomputing_the_prefix(fields):
    """The KV cache's position offset reaches the learned embedding too."""
    model = model_of(**fields)
    with torch.no_grad():
        if model.pos_embed is not None:
            model.pos_embed.weight.normal_()
    prompt = torch.randint(0, 256, (2, 5))
    assert torch.equal(
        model.generate(prompt, 8, use_cache=True), model.generate(prompt, 8, use_cache=False)
    )
