"""Grouped-query attention with rotary positions. The weights live once per layer; each visit
passes in its own hook points, so visit 0 and visit 1 are cached under different names.

Two paths: the fused path (`scaled_dot_product_attention`) by default, and an explicit path that
materialises the pattern, taken only when a visit's `hook_pattern` is hooked or forced. Both
take an optional `hidden` [batch, keys] mask of keys no query may attend to (besides the causal
mask): ModelConfig.hidden_key_ids, flagged once per forward by SmeltModel.key_mask. The kernel
switches (model.kernels: fused QKV, cached weight copies, SDPA priority and logging) change how
q, k, v and z are computed, never their values beyond rounding or the hook points."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from smelt_interp.config import ModelConfig
from smelt_interp.model.kernels import DEFAULT, joined_weight, note_sdpa, sdpa_context
from smelt_interp.model.kv_cache import KVCache
from smelt_interp.model.rope import RopeTables, Rotary, apply_rotary


class AttentionHooks(nn.Module):
    """One visit's attention hook points (parameter-free)."""

    def __init__(self) -> None:
        super().__init__()
        self.hook_q = HookPoint()  # [batch, pos, n_heads, d_head], after RoPE
        self.hook_k = HookPoint()  # [batch, pos, n_kv_heads, d_head], after RoPE
        self.hook_v = HookPoint()  # [batch, pos, n_kv_heads, d_head]
        self.hook_pattern = HookPoint()  # [batch, n_heads, q_pos, k_pos], explicit path only
        self.hook_z = HookPoint()  # [batch, pos, n_heads, d_head]
        self.force_pattern = False  # set by interventions that edit the pattern (nnsight)

    def wants_pattern(self) -> bool:
        hp = self.hook_pattern
        return self.force_pattern or bool(hp._forward_hooks) or bool(hp._forward_pre_hooks)


def causal_mask(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """Boolean [q_len, k_len] mask for queries at the last q_len of k_len positions."""
    q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    return torch.arange(k_len, device=device)[None, :] <= q_pos


def visible_keys(q_len: int, hidden: torch.Tensor) -> torch.Tensor:
    """Boolean [batch, 1, q_len, k_len]: the causal mask with the `hidden` [batch, k_len] keys
    removed, for queries at the last q_len positions."""
    causal = causal_mask(q_len, hidden.shape[1], hidden.device)
    return causal[None, None] & ~hidden[:, None, None, :]


class Attention(nn.Module):
    """Pre-projected GQA attention: W_q, W_k, W_v, W_o with no biases."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.W_q = nn.Linear(cfg.d_model, cfg.n_heads * cfg.d_head, bias=False)
        self.W_k = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=False)
        self.W_v = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=False)
        self.W_o = nn.Linear(cfg.n_heads * cfg.d_head, cfg.d_model, bias=False)
        self.kernels = DEFAULT  # model.kernels.apply_kernels sets the switches

    def forward(
        self,
        x: torch.Tensor,
        hooks: AttentionHooks,
        rope: Rotary | RopeTables,
        cache: KVCache | None = None,
        cache_key: tuple[int, int] | None = None,
        hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`rope`: the tables already sliced for this pass's positions (the model slices them
        once per forward), or the Rotary module itself, sliced here at the cache's offset.
        `hidden` [batch, keys]: keys no query sees (with a cache, its past positions' too)."""
        cfg = self.cfg
        b, t, _ = x.shape
        if isinstance(rope, Rotary):
            rope = rope.tables(cache.seq_len_for(cache_key) if cache is not None else 0, t)
        q, k, v = self._project(x)
        q = q.view(b, t, cfg.n_heads, cfg.d_head)
        k = k.view(b, t, cfg.n_kv_heads, cfg.d_head)
        if cfg.positions == "rope":  # learned positions are already in x (SmeltModel.forward)
            q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        v = v.view(b, t, cfg.n_kv_heads, cfg.d_head)
        q, k, v = hooks.hook_q(q), hooks.hook_k(k), hooks.hook_v(v)
        if cache is not None:
            k, v = cache.append(cache_key, k, v)
        if hooks.wants_pattern():
            z = self._explicit(q, k, v, hooks, hidden)
        else:
            z = self._fused(q, k, v, hidden)
        z = hooks.hook_z(z).reshape(b, t, cfg.n_heads * cfg.d_head)
        if self.kernels.weight_cache:
            return F.linear(z, self._weight("o", (self.W_o.weight,), z))
        return self.W_o(z)

    def _weight(
        self, name: str, weights: tuple[torch.Tensor, ...], x: torch.Tensor
    ) -> torch.Tensor:
        """The weights concatenated by rows, in autocast's dtype where autocast is on (from the
        per-step cache with `weight_cache`), so F.linear casts nothing per visit."""
        on = torch.is_autocast_enabled(x.device.type)
        dtype = torch.get_autocast_dtype(x.device.type) if on else None
        return joined_weight(self, name, weights, dtype, 0)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as [batch, pos, heads * d_head]: three products, or one over the fused rows."""
        kernels, projections = self.kernels, (self.W_q, self.W_k, self.W_v)
        if kernels.fused_qkv:
            weight = self._weight("qkv", tuple(p.weight for p in projections), x)
            sizes = [p.weight.shape[0] for p in projections]
            q, k, v = F.linear(x, weight).split(sizes, dim=-1)
            return q, k, v
        if kernels.weight_cache:
            q, k, v = (
                F.linear(x, self._weight(n, (p.weight,), x)) for n, p in zip("qkv", projections)
            )
            return q, k, v
        return self.W_q(x), self.W_k(x), self.W_v(x)

    def _fused(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor | None
    ) -> torch.Tensor:
        q_len, k_len = q.shape[1], k.shape[1]
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        mask, causal = None, False
        if hidden is not None:
            mask = visible_keys(q_len, hidden)
        elif q_len == k_len:
            causal = True
        elif q_len != 1:
            mask = causal_mask(q_len, k_len, q.device)
        with sdpa_context(self.kernels.sdpa_priority):
            if self.kernels.log_sdpa and not torch.compiler.is_compiling():
                note_sdpa(qh, kh, vh, mask, causal)
            out = F.scaled_dot_product_attention(
                qh, kh, vh, attn_mask=mask, is_causal=causal, enable_gqa=True
            )
        return out.transpose(1, 2)

    def _explicit(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        hooks: AttentionHooks,
        hidden: torch.Tensor | None,
    ) -> torch.Tensor:
        group = self.cfg.n_group
        qh = q.transpose(1, 2)  # [b, h, q, d]
        kh = k.transpose(1, 2).repeat_interleave(group, dim=1)  # [b, h, k, d]
        vh = v.transpose(1, 2).repeat_interleave(group, dim=1)
        scores = (qh @ kh.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if hidden is None:
            mask = causal_mask(q.shape[1], k.shape[1], q.device)
        else:
            mask = visible_keys(q.shape[1], hidden)
        scores = scores.masked_fill(~mask, float("-inf"))
        pattern = hooks.hook_pattern(torch.softmax(scores.float(), dim=-1).to(q.dtype))
        return (pattern @ vh).transpose(1, 2)
