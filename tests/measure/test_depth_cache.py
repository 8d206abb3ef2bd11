"""Views by execution order: TransformerLens's ActivationCache tools over the depth aliases
reproduce the model's own logits and residual stream, on SMELT (looped) and Baseline models,
with an RMS or a LayerNorm final norm, and on a stand-in for an adapted model that exposes only
the accessors (final_norm, unembed_weight, head_out)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers.perturbed import (
    norm_case_model,  # noqa: F401 (the `model` fixture)
    perturbed,
)
from torch import nn

from smelt_interp.errors import ProbeError
from smelt_interp.measure.depth_cache import (
    HeadOut,
    check_readout,
    depth_cache,
    depth_hook_names,
    depth_name,
    head_out,
    readout_of,
    run_with_depth_cache,
)
from smelt_interp.model.protocol import hook_name
from smelt_interp.model.transformer import SmeltModel

ATOL = 1e-4


@pytest.fixture
def tokens(make_tokens) -> torch.Tensor:
    return make_tokens(2, 12)


def per_visit_cache(model: Any, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    wanted = frozenset(depth_hook_names(model))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=wanted.__contains__)
    return logits, dict(cache)


def test_depth_names_follow_the_schedule(tiny_model: SmeltModel):
    depths = {lv: d for d, lv in enumerate(tiny_model.schedule)}
    assert tiny_model.schedule == ((0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (3, 0))
    assert depth_name(hook_name(1, 1, "attn.hook_z"), depths) == "blocks.3.attn.hook_z"
    assert depth_name(hook_name(3, 0, "hook_resid_post"), depths) == "blocks.5.hook_resid_post"
    assert depth_name("hook_embed", depths) == "hook_embed"
    with pytest.raises(ProbeError, match="layer 3 visit 1 is not in the schedule"):
        depth_name("blocks.3.visits.1.hook_mlp_out", depths)


def test_accumulated_resid_at_the_last_depth_gives_the_logits(model, tokens):
    logits, per_visit = per_visit_cache(model, tokens)
    cache = depth_cache(model, per_visit)
    view = cache.model
    assert view.cfg.n_layers == len(model.schedule)
    stack, labels = cache.accumulated_resid(apply_ln=True, return_labels=True)
    assert labels[-1] == "final_post" and len(labels) == len(model.schedule) + 1
    assert torch.allclose(view.unembed(stack[-1]), logits, atol=ATOL)
    # depth d's entry is the residual entering visit d of the schedule, under its own name
    raw = cache.accumulated_resid()
    for d, (layer, visit) in enumerate(model.schedule):
        assert torch.equal(raw[d], per_visit[hook_name(layer, visit, "hook_resid_pre")])


def test_decompose_resid_sums_to_the_final_residual(model, tokens):
    _, per_visit = per_visit_cache(model, tokens)
    cache = depth_cache(model, per_visit)
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels[0] == "embed" and len(labels) == 1 + 2 * len(model.schedule)
    final = per_visit[hook_name(*model.schedule[-1], "hook_resid_post")]
    assert torch.allclose(parts.sum(0), final, atol=1e-5)


def test_head_results_sum_to_each_visits_attention_write(model, tokens):
    _, per_visit = per_visit_cache(model, tokens)
    cache = depth_cache(model, per_visit)
    heads = cache.stack_head_results()  # [depth * head, batch, pos, d_model]
    n_heads = model.cfg.n_heads
    for d, (layer, visit) in enumerate(model.schedule):
        write = heads[d * n_heads : (d + 1) * n_heads].sum(0)
        assert torch.allclose(write, per_visit[hook_name(layer, visit, "hook_attn_out")], atol=1e-6)


@pytest.mark.parametrize("against", [None, 7])
def test_logit_attrs_of_the_decomposed_stack_sum_to_the_logit(model, tokens, against):
    """Up to the final norm's frozen scale, the components' attributions sum to the model's
    next-token logit (or logit difference), less the final norm's bias through W_U."""
    logits, cache = run_with_depth_cache(model, tokens)
    view = cache.model
    targets = tokens[:, 1:]
    parts = cache.decompose_resid(pos_slice=slice(0, -1))
    wrong = None if against is None else torch.full_like(targets, against)
    attrs = cache.logit_attrs(parts, targets, incorrect_tokens=wrong, pos_slice=slice(0, -1))
    want = logits[:, :-1].gather(-1, targets[..., None])[..., 0] - view.b_U[targets]
    if against is not None:
        want = want - (logits[:, :-1, against] - view.b_U[against])
    assert attrs.shape == (parts.shape[0], *targets.shape)
    assert torch.allclose(attrs.sum(0), want, atol=ATOL)


def test_block_norm_scales_are_cached_per_depth(tiny_model, tokens):
    """ln1/ln2 scales: sqrt(mean x^2 + eps) of the residual entering each visit's sublayers."""
    _, cache = run_with_depth_cache(tiny_model, tokens)
    eps = tiny_model.cfg.norm_eps
    for d in range(len(tiny_model.schedule)):
        for ln, hook in (("ln1", "hook_resid_pre"), ("ln2", "hook_resid_mid")):
            resid = cache[f"blocks.{d}.{hook}"].double()
            want = (resid.pow(2).mean(-1, keepdim=True) + eps).sqrt()
            assert torch.allclose(cache[f"blocks.{d}.{ln}.hook_scale"].double(), want, rtol=1e-5)
    stack = cache.decompose_resid(layer=3, mlp_input=True, apply_ln=True)
    assert stack.shape[0] == 1 + 2 * 3 + 1


class HfRmsNorm(nn.Module):
    """A transformers-style final RMSNorm: `variance_epsilon` and a `weight`."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (
            self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        )


class StandIn:
    """What an adapted model exposes, and nothing of SmeltModel's internals."""

    def __init__(self, model: SmeltModel) -> None:
        self._model = model
        self.cfg, self.schedule = model.cfg, model.schedule
        self.final_norm = HfRmsNorm(model.ln_final.weight, model.cfg.norm_eps)
        self.unembed_weight = model.unembed.weight

    def run_with_cache(self, *args: Any, **kwargs: Any) -> Any:
        return self._model.run_with_cache(*args, **kwargs)

    def head_out(self, layer: int, visit: int) -> HeadOut:
        cfg, attn = self.cfg, self._model.blocks[layer].attn
        W_O = attn.W_o.weight.T.reshape(cfg.n_heads, cfg.d_head, cfg.d_model)
        return HeadOut(W_O.detach(), None, cfg.residual_scale(layer))


def test_an_adapted_model_needs_only_the_accessors(make_cfg, make_model, tokens):
    model = perturbed(make_model(make_cfg(looped=True)))
    logits, cache = run_with_depth_cache(StandIn(model), tokens)
    _, ours = run_with_depth_cache(model, tokens)
    stack = cache.accumulated_resid(apply_ln=True)
    assert torch.allclose(cache.model.unembed(stack[-1]), logits, atol=ATOL)
    assert torch.allclose(cache.stack_head_results(), ours.stack_head_results())
    assert "blocks.0.ln1.hook_scale" not in cache  # no pre_norms exposed: no block scales


def test_what_a_view_cannot_read_is_one_line(tiny_model, tokens):
    with pytest.raises(ProbeError, match="exposes no readout.*final_norm and unembed_weight"):
        readout_of(object())
    with pytest.raises(ProbeError, match="exposes no head_out"):
        head_out(object(), 0, 0)
    stand_in = StandIn(tiny_model)
    stand_in.final_norm = nn.GroupNorm(1, tiny_model.cfg.d_model)
    with pytest.raises(ProbeError, match="cannot read the norm GroupNorm.*readout()"):
        readout_of(stand_in)
    logits, per_visit = per_visit_cache(tiny_model, tokens)
    readout = readout_of(tiny_model)
    final = per_visit[hook_name(*tiny_model.schedule[-1], "hook_resid_post")]
    with pytest.raises(ProbeError, match="does not reproduce the model's logits"):
        check_readout(readout, final, logits + 1.0)
    broken = {**per_visit, hook_name(1, 0, "hook_resid_pre"): final}
    with pytest.raises(ProbeError, match="does not thread one residual stream"):
        depth_cache(tiny_model, broken)
    assert len(depth_cache(tiny_model, broken, check_stream=False).accumulated_resid()) == 7
    with pytest.raises(ProbeError, match="depth 0's hook_resid_pre is not hook_embed"):
        depth_cache(tiny_model, {**per_visit, "hook_embed": final})
