"""Which fused attention kernels (SDPA backends) a head width is eligible for on an H200 (sm90)
in bf16, as PyTorch's `sdp_utils.cpp` states the rules, and how much of flash's work is useful.

- cuDNN attention: d_head % 8 == 0 and d_head <= 128 (`check_head_dim_size_cudnn`);
- memory-efficient attention: d_head % 8 == 0 for 2-byte types (`check_head_dim_size_mem_efficient`:
  16-byte aligned rows);
- flash attention: d_head <= 256 (`check_head_dim_size_flash`); the input is padded to a
  multiple of 8 and the kernel is compiled for head widths 32, 64, 96, ..., 256, so d_head 44
  runs the 64-wide kernel (69% useful), 56 the 64-wide one (88%), 32 the 32-wide one (100%).

tests/gpu/test_gpu_shapes.py holds every GPU preset's shapes to this table; on a GPU,
tests/gpu/test_cuda.py holds the table to `torch.backends.cuda.can_use_*_attention`."""

from __future__ import annotations

from typing import Any

FLASH_WIDTHS = tuple(range(32, 257, 32))
GPU_PRESETS = ("sink-pair-gpu", "lm-pair-gpu", "paper-200m")


def flash_width(d_head: int) -> int | None:
    """The head width of the flash kernel that runs `d_head` (None: flash refuses it)."""
    return next((w for w in FLASH_WIDTHS if w >= d_head), None)


def eligible_backends(d_head: int) -> dict[str, Any]:
    """{"cudnn", "efficient", "flash": eligible?, "flash_useful": d_head / kernel width}."""
    width = flash_width(d_head)
    return {
        "cudnn": d_head % 8 == 0 and d_head <= 128,
        "efficient": d_head % 8 == 0,
        "flash": width is not None,
        "flash_useful": d_head / width if width else 0.0,
    }


def preset_heads(preset: str) -> dict[str, dict[str, int]]:
    """Per architecture of the preset's pair: n_heads, n_kv_heads, d_head."""
    from smelt_interp.train.config import TrainConfig
    from smelt_interp.train.presets import get_preset

    out = {}
    for arch in ("baseline", "smelt"):
        m = TrainConfig.from_dict({**get_preset(preset), "arch": arch}).model_config()
        out[arch] = {"n_heads": m.n_heads, "n_kv_heads": m.n_kv_heads, "d_head": m.d_head}
    return out
