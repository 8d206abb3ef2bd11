"""`smelt::grouped_mm`: the grouped matrix product of the MoE dispatch as a custom op.

`F.grouped_mm` runs in float32 on CPU, but under `torch.compile` its fake-tensor rule demands
bf16 inputs, so a compiled CPU step fails. As a custom op it is opaque to the compiler: the fake
rule below gives only the output shape, and the backward is grouped too (grad of the input rows
through the transposed weights; each group's weight gradient as one 2-D x 2-D grouped product),
so neither pass falls back to a per-expert loop or a host sync."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def _kernel() -> Callable[..., torch.Tensor]:
    """`F.grouped_mm`, or in a torch without that public name `torch._grouped_mm`, the same
    kernel under its earlier private name (the GPU machine's image may ship an older torch than
    the Makefile pins). Looked up at each call, so tests can intercept `F.grouped_mm`."""
    return getattr(F, "grouped_mm", None) or torch._grouped_mm


@torch.library.custom_op("smelt::grouped_mm", mutates_args=())
def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows a [N, K] sorted by group, weights b [G, K, M], offs [G] int32 cumulative row ends
    -> [N, M], where the rows of group g are multiplied by b[g]."""
    return _kernel()(a, b, offs=offs)


@torch.library.custom_op("smelt::grouped_mm_weight_grad", mutates_args=())
def grouped_mm_weight_grad(a: torch.Tensor, grad: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Per group g: a[rows of g]^T @ grad[rows of g] -> [G, K, M] (zero for an empty group)."""
    return _kernel()(a.t(), grad, offs=offs)


@grouped_mm.register_fake
def _grouped_mm_fake(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return a.new_empty(a.shape[0], b.shape[-1])


@grouped_mm_weight_grad.register_fake
def _weight_grad_fake(a: torch.Tensor, grad: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return a.new_empty(offs.shape[0], a.shape[1], grad.shape[1])


def _setup_context(ctx, inputs, output) -> None:  # noqa: ANN001 - torch.library's signature
    a, b, offs = inputs
    ctx.save_for_backward(a, b, offs)


def _backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN202 - torch.library's signature
    a, b, offs = ctx.saved_tensors
    grad = grad.contiguous()  # the CPU kernel rejects stride-0 gradients (e.g. from sum())
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = grouped_mm(grad, b.transpose(-1, -2), offs)
    if ctx.needs_input_grad[1]:
        grad_b = grouped_mm_weight_grad(a, grad, offs)
    return grad_a, grad_b, None


grouped_mm.register_autograd(_backward, setup_context=_setup_context)
