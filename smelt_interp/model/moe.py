"""Sparse MoE feed-forward: a softmax top-k router and SwiGLU experts, dispatched by sorting
token slots by expert and running all experts as grouped matrix products (gate and up fused
into one). The per-expert Python loop is kept as the reference the grouped path is tested
against.

The grouped path has no host sync (group offsets come from a sort and `searchsorted`, as a
tensor), so it compiles as one graph (`torch.compile(fullgraph=True)`). Its kernel switches
(model.kernels): `moe_gather` moves rows through the sort's permutation and its inverse by
gathers only, in both directions (the default's `index_add_` is an atomic scatter on a GPU), and
`weight_cache` reuses the experts' low-precision weights for a whole optimizer step."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from smelt_interp.config import ModelConfig
from smelt_interp.model.grouped_mm import grouped_mm
from smelt_interp.model.kernels import DEFAULT, joined_weight


class MoEHooks(nn.Module):
    """One visit's routing hook points (parameter-free)."""

    def __init__(self) -> None:
        super().__init__()
        self.hook_router_logits = HookPoint()  # [batch, pos, n_experts]
        self.hook_expert_indices = HookPoint()  # [batch, pos, top_k] int
        self.hook_expert_weights = HookPoint()  # [batch, pos, top_k], renormalised


@dataclass
class RouterLosses:
    """Auxiliary losses of one MoE call: load balance E * sum f_e P_e, and z-loss."""

    load_balance: torch.Tensor
    z_loss: torch.Tensor


def router_losses(
    logits: torch.Tensor,
    indices: torch.Tensor,
    n_experts: int,
    probs: torch.Tensor | None = None,
) -> RouterLosses:
    """Load-balance and z-loss from router logits [N, E] and chosen experts [N, k] (pass the
    router's float32 softmax `probs` [N, E] if already computed).

    E * sum_e f_e P_e, with f_e the share of slots routed to e and P_e the mean probability of
    e, equals E times the mean of P over the chosen slots: no per-expert count (no bincount,
    whose output size is data-dependent), and the same gradient (E f_e into P_e)."""
    logits = logits.float()
    if probs is None:
        probs = logits.softmax(dim=-1)
    p = probs.reshape(-1, n_experts).mean(dim=0)
    balance = n_experts * p.index_select(0, indices.reshape(-1)).mean()
    z = torch.logsumexp(logits, dim=-1).pow(2).mean()
    return RouterLosses(load_balance=balance, z_loss=z)


def _grouped_ok(x: torch.Tensor, d_model: int, d_expert: int) -> bool:
    """grouped_mm needs 16-byte aligned rows and a float32/bf16/fp16 input (float64 is
    rejected); on CUDA its kernels want bf16."""
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    per16 = 16 // x.element_size()
    aligned = d_model % per16 == 0 and d_expert % per16 == 0
    return aligned and (x.device.type == "cpu" or x.dtype == torch.bfloat16)


class Experts(nn.Module):
    """E SwiGLU experts stored as stacked weights [E, d_in, d_out]."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        e, d, h = cfg.n_experts, cfg.d_model, cfg.d_expert
        self.W_gate = nn.Parameter(torch.empty(e, d, h))
        self.W_up = nn.Parameter(torch.empty(e, d, h))
        self.W_down = nn.Parameter(torch.empty(e, h, d))
        self.kernels = DEFAULT  # model.kernels.apply_kernels sets the switches

    def forward(
        self,
        x: torch.Tensor,
        indices: torch.Tensor,
        weights: torch.Tensor,
        dispatch: str = "grouped",
    ) -> torch.Tensor:
        """x [N, d], indices/weights [N, k] -> weighted sum of chosen experts' outputs [N, d]."""
        if dispatch == "grouped":
            compute = x
            if x.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
                compute = x.to(torch.get_autocast_dtype("cuda"))  # grouped kernels want bf16
            if _grouped_ok(compute, self.W_gate.shape[1], self.W_gate.shape[2]):
                return self._grouped(compute, indices, weights).to(x.dtype)  # one rounding
        return self.loop(x, indices, weights)

    def _grouped(
        self, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        n_experts, k = self.W_gate.shape[0], indices.shape[1]
        flat = indices.reshape(-1)
        expert_sorted, order = torch.sort(flat, stable=True)
        token_of = order // k
        # offs[e] = slots routed to experts 0..e: a tensor, never a Python list (no host sync)
        experts = torch.arange(n_experts, device=flat.device, dtype=flat.dtype)
        offs = torch.searchsorted(expert_sorted, experts, right=True, out_int32=True)
        if self.kernels.moe_gather:
            return self._gathered(x, weights, order, offs, k)
        xs = x.index_select(0, token_of)  # its backward is index_add_, far cheaper than x[...]'s
        gate, up = self._gate_up(xs, offs)
        hidden = F.silu(gate) * up
        ys = grouped_mm(hidden, self._down(xs.dtype), offs)
        # the top-k contributions of a token summed in float32 (in bf16, each of the k atomic
        # adds would round); a no-op for float32 inputs
        acc = torch.promote_types(ys.dtype, torch.float32)
        ys = ys.to(acc) * weights.reshape(-1).index_select(0, order)[:, None].to(acc)
        return torch.zeros_like(x, dtype=acc).index_add_(0, token_of, ys)

    def _gate_up(self, xs: torch.Tensor, offs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gate and up as one product over their concatenated columns: a third fewer grouped
        calls forward and backward (benchmarks/README.md); cat's backward splits the gradient."""
        w_gate_up = joined_weight(self, "gate_up", (self.W_gate, self.W_up), xs.dtype, -1)
        return grouped_mm(xs, w_gate_up, offs).split(self.W_gate.shape[-1], dim=-1)

    def _down(self, dtype: torch.dtype) -> torch.Tensor:
        return joined_weight(self, "down", (self.W_down,), dtype, 0)

    def _gathered(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        order: torch.Tensor,
        offs: torch.Tensor,
        k: int,
    ) -> torch.Tensor:
        """The grouped chain with gathers in place of scatters: slot i of the sorted order
        takes token order[i] // k, and token t sums its k slots at inverse[t * k + j]."""
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device, dtype=order.dtype)
        xs = _ToSlots.apply(x, order, inverse, k)
        w = _Permute.apply(weights.reshape(-1, 1), order, inverse)
        gate, up = self._gate_up(xs, offs)
        # the router weight on the hidden rows, in float32 then rounded once (fused when compiled)
        hidden = (F.silu(gate) * up * w).to(xs.dtype)
        ys = grouped_mm(hidden, self._down(xs.dtype), offs)
        acc = torch.promote_types(ys.dtype, torch.float32)
        back = _Permute.apply(ys, inverse, order).view(x.shape[0], k, -1)
        return back.to(acc).sum(dim=1)  # the k contributions summed in float32

    def loop(self, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Reference dispatch: one matmul chain per expert over the slots routed to it."""
        out = torch.zeros_like(x)
        for e in range(self.W_gate.shape[0]):
            token, slot = torch.nonzero(indices == e, as_tuple=True)
            if token.numel() == 0:
                continue
            xe = x[token]
            hidden = F.silu(xe @ self.W_gate[e].to(xe.dtype)) * (xe @ self.W_up[e].to(xe.dtype))
            ye = (hidden @ self.W_down[e].to(xe.dtype)) * weights[token, slot, None].to(xe.dtype)
            out.index_add_(0, token, ye.to(out.dtype))
        return out


class _Permute(torch.autograd.Function):
    """rows[index] for a permutation `index`; the backward gathers through `inverse` (a scatter
    through a permutation is a gather through its inverse: no atomics)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor):  # noqa: ANN001, ANN205
        ctx.save_for_backward(inverse)
        return rows.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        (inverse,) = ctx.saved_tensors
        return grad.index_select(0, inverse), None, None


class _ToSlots(torch.autograd.Function):
    """x [N, d] -> its sorted slots [N * k, d] (slot i holds token order[i] // k); the backward
    gathers each token's k slot gradients through `inverse` and sums them, no atomics."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor, k: int):  # noqa: ANN001, ANN205
        ctx.save_for_backward(inverse)
        ctx.k = k
        return x.index_select(0, order // k)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        (inverse,) = ctx.saved_tensors
        slots = grad.index_select(0, inverse)
        return slots.view(-1, ctx.k, grad.shape[-1]).sum(dim=1), None, None, None


class MoE(nn.Module):
    """Router + experts. Returns the layer output and the router's auxiliary losses."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = Experts(cfg)
        self.dispatch = "grouped"  # or "loop": the reference path

    def forward(self, x: torch.Tensor, hooks: MoEHooks) -> tuple[torch.Tensor, RouterLosses]:
        b, t, d = x.shape
        logits = hooks.hook_router_logits(self.router(x))
        probs = logits.float().softmax(dim=-1)
        top_w, top_i = probs.topk(self.cfg.top_k, dim=-1)
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        top_i = hooks.hook_expert_indices(top_i)
        top_w = hooks.hook_expert_weights(top_w)
        flat_i = top_i.reshape(b * t, -1)
        y = self.experts(x.reshape(b * t, d), flat_i, top_w.reshape(b * t, -1), self.dispatch)
        losses = router_losses(logits.reshape(b * t, -1), flat_i, self.cfg.n_experts, probs)
        return y.view(b, t, d), losses
