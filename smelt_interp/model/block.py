"""One physical layer: pre-norm attention then pre-norm MoE, with its weights held once and one
set of hook points per visit. Inside the looped span each write is scaled by 1 / n_loops."""

from __future__ import annotations

import torch
from torch import nn
from transformer_lens.hook_points import HookPoint

from smelt_interp.config import ModelConfig
from smelt_interp.model.attention import Attention, AttentionHooks
from smelt_interp.model.kv_cache import KVCache
from smelt_interp.model.moe import MoE, MoEHooks, RouterLosses
from smelt_interp.model.rope import RopeTables, Rotary


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


class Block(nn.Module):
    """A pre-norm attention + MoE layer that can run several times per forward pass."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.scale = cfg.residual_scale(layer)
        self.ln_attn = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ln_mlp = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.moe = MoE(cfg)
        self.visits = nn.ModuleList(VisitHooks() for _ in range(cfg.visits_of(layer)))

    def forward(
        self,
        x: torch.Tensor,
        visit: int,
        rope: Rotary | RopeTables,
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, RouterLosses]:
        """One visit; `rope` is best the forward pass's sliced RoPE tables (see Attention)."""
        hooks = self.visits[visit]
        x = hooks.hook_resid_pre(x)
        attn_out = self.attn(self.ln_attn(x), hooks.attn, rope, cache, (self.layer, visit))
        x = hooks.hook_resid_mid(x + hooks.hook_attn_out(self._scaled(attn_out)))
        mlp_out, losses = self.moe(self.ln_mlp(x), hooks.moe)
        x = hooks.hook_resid_post(x + hooks.hook_mlp_out(self._scaled(mlp_out)))
        return x, losses

    def _scaled(self, write: torch.Tensor) -> torch.Tensor:
        return write if self.scale == 1.0 else write * self.scale
