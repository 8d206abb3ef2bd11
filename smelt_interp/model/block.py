"""One physical layer: pre-norm attention then pre-norm MoE, with its weights held once and one
set of hook points per visit. Inside the looped span each write is scaled by 1 / n_loops."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformer_lens.hook_points import HookPoint

from smelt_interp.config import ModelConfig
from smelt_interp.model.attention import Attention, AttentionHooks
from smelt_interp.model.kv_cache import KVCache
from smelt_interp.model.moe import MoE, MoEHooks, RouterLosses
from smelt_interp.model.rope import RopeTables, Rotary


def make_norm(cfg: ModelConfig) -> nn.Module:
    """The pre-norm of a sublayer (and the final norm): RMSNorm, or LayerNorm with a bias for
    `cfg.norm == "layer"`."""
    if cfg.norm == "layer":
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)


class VisitHooks(nn.Module):
    """All hook points of one visit of one layer: `blocks.{layer}.visits.{v}.*`."""

    def __init__(self) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.attn = AttentionHooks()
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.moe = MoEHooks()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()


# Hook points no one hooks, shared by every compiled visit, so the graph sees one object (a
# module attribute, not a submodule: it adds no hook names to the model).
FREE_HOOKS = VisitHooks()


def _hooked(hooks: nn.Module) -> bool:
    """Whether any hook point under `hooks` has a hook attached or forces the pattern path."""
    return any(
        m._forward_hooks or m._forward_pre_hooks or getattr(m, "force_pattern", False)
        for m in hooks.modules()
    )


def visit_compute(
    block: Block,
    x: torch.Tensor,
    rope: RopeTables,
    hooks: VisitHooks,
    scale: torch.Tensor,
    hidden: torch.Tensor | None = None,
) -> tuple[torch.Tensor, RouterLosses]:
    """One visit of `block` with no hook attached and no cache: what `Block.forward` computes,
    with the residual scale as a tensor, so that compiled (SmeltModel.compile_blocks) one graph
    serves every layer and visit (the layer's weights and the scale are its inputs)."""
    attn_out = block.attn(block.ln_attn(x), hooks.attn, rope, hidden=hidden)
    x = x + attn_out * scale
    mlp_out, losses = block.moe(block.ln_mlp(x), hooks.moe)
    return x + mlp_out * scale, losses


class Block(nn.Module):
    """A pre-norm attention + MoE layer that can run several times per forward pass."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.scale = cfg.residual_scale(layer)
        self.hides_keys = cfg.hides_keys(layer)
        self.ln_attn = make_norm(cfg)
        self.attn = Attention(cfg)
        self.ln_mlp = make_norm(cfg)
        self.moe = MoE(cfg)
        self.visits = nn.ModuleList(VisitHooks() for _ in range(cfg.visits_of(layer)))
        # the scale as a tensor input of the compiled visit (not persistent: it follows the config)
        self.register_buffer("scale_t", torch.tensor(self.scale), persistent=False)
        self.compiled: Callable[..., tuple[torch.Tensor, RouterLosses]] | None = None

    def forward(
        self,
        x: torch.Tensor,
        visit: int,
        rope: Rotary | RopeTables,
        cache: KVCache | None = None,
        hidden: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, RouterLosses]:
        """One visit; `rope` is best the forward pass's sliced RoPE tables (see Attention).
        `hidden`: the model's hidden-key flags [batch, keys], applied if this layer hides keys."""
        hooks = self.visits[visit]
        hidden = hidden if self.hides_keys else None
        if (
            self.compiled is not None
            and self.training
            and cache is None
            and isinstance(rope, RopeTables)
            and not _hooked(hooks)
        ):
            return self.compiled(self, x, rope, FREE_HOOKS, self.scale_t.to(x.dtype), hidden)
        x = hooks.hook_resid_pre(x)
        key = (self.layer, visit)
        attn_out = self.attn(self.ln_attn(x), hooks.attn, rope, cache, key, hidden)
        x = hooks.hook_resid_mid(x + hooks.hook_attn_out(self._scaled(attn_out)))
        mlp_out, losses = self.moe(self.ln_mlp(x), hooks.moe)
        x = hooks.hook_resid_post(x + hooks.hook_mlp_out(self._scaled(mlp_out)))
        return x, losses

    def _scaled(self, write: torch.Tensor) -> torch.Tensor:
        return write if self.scale == 1.0 else write * self.scale
