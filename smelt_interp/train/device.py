"""The training device: which one a config names and how much memory a batch may use there (the
autocast a step runs under is the model's: model.transformer.autocast_for)."""

from __future__ import annotations

import torch

from smelt_interp.errors import ConfigError
from smelt_interp.machine import memory_limit_bytes


def resolve_device(name: str) -> torch.device:
    """The device `name` (see TrainConfig.device), or a ConfigError if this machine lacks it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and (
        not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()
    ):
        raise ConfigError(f"device {name} is not available here (no such CUDA device)")
    return device


def device_memory_bytes(device: torch.device) -> int:
    """What a training batch may use: the GPU's memory, or the machine's RAM."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return memory_limit_bytes()
