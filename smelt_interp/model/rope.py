"""Rotary position embeddings (rotate-half form), cached per device and dtype.

A forward pass slices the tables once (`Rotary.tables`) and hands the slice to every visit, so
a looped model does not re-slice them per layer visit."""

from __future__ import annotations

from typing import NamedTuple

import torch


class RopeTables(NamedTuple):
    """cos and sin of the rotary angles at the positions of one forward pass, [pos, 1, d_head]."""

    cos: torch.Tensor
    sin: torch.Tensor


def apply_rotary(x: torch.Tensor, tables: RopeTables) -> torch.Tensor:
    """RoPE on x [batch, pos, heads, d_head] at the positions `tables` was sliced for."""
    cos, sin = tables.cos.to(x.dtype), tables.sin.to(x.dtype)  # no copy when dtypes match
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Rotary(torch.nn.Module):
    """Applies RoPE to a [batch, pos, heads, d_head] tensor at absolute positions."""

    def __init__(self, d_head: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, d_head, 2, dtype=torch.float64) / d_head))
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        # Buffers are non-persistent: they follow the config, not the checkpoint.
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def tables(self, offset: int, length: int) -> RopeTables:
        """The tables at positions offset .. offset + length - 1."""
        end = offset + length
        return RopeTables(self.cos[offset:end, None, :], self.sin[offset:end, None, :])

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return apply_rotary(x, self.tables(offset, x.shape[1]))
