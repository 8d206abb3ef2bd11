"""Rotary position embeddings (rotate-half form), cached per device and dtype."""

from __future__ import annotations

import torch


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

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        t = x.shape[1]
        cos = self.cos[offset : offset + t, None, :].to(x.dtype)
        sin = self.sin[offset : offset + t, None, :].to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin
