"""Rotary position embeddings (rotate-half form), cached per device and dtype.

A forward pass slices the tables once (`Rotary.tables`) and hands the slice to every visit, so
a looped model does not re-slice them per layer visit. The rotate-half's sign lives in the sin
table, so a visit rotates with one `roll` (one copy, its backward one more) instead of a
negation, two slices and a `cat` (whose backward zero-fills and copies each slice): the same
floats, forward and backward, about 1.5x faster on CPU."""

from __future__ import annotations

from typing import NamedTuple

import torch


class RopeTables(NamedTuple):
    """cos and signed sin of the rotary angles at the positions of one forward pass, each
    [pos, 1, d_head]; `signed_sin` is sin with its first half negated (the rotate-half sign)."""

    cos: torch.Tensor
    signed_sin: torch.Tensor


def apply_rotary(x: torch.Tensor, tables: RopeTables) -> torch.Tensor:
    """RoPE on x [batch, pos, heads, d_head] at the positions `tables` was sliced for:
    x * cos + cat(-x2, x1) * sin, written as x * cos + roll(x, d/2) * signed_sin."""
    cos, signed_sin = tables.cos.to(x.dtype), tables.signed_sin.to(x.dtype)  # no copy if same
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin


class Rotary(torch.nn.Module):
    """Applies RoPE to a [batch, pos, heads, d_head] tensor at absolute positions."""

    def __init__(self, d_head: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, d_head, 2, dtype=torch.float64) / d_head))
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
        sin = angles.sin()
        angles = torch.cat([angles, angles], dim=-1)
        # Buffers are non-persistent: they follow the config, not the checkpoint.
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("signed_sin", torch.cat([-sin, sin], dim=-1).float(), persistent=False)

    def tables(self, offset: int, length: int) -> RopeTables:
        """The tables at positions offset .. offset + length - 1."""
        end = offset + length
        return RopeTables(self.cos[offset:end, None, :], self.signed_sin[offset:end, None, :])

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return apply_rotary(x, self.tables(offset, x.shape[1]))
