"""smelt-interp: train compute-matched SMELT/Baseline MoE transformers and look inside them,
visit by visit.

The model is imported lazily, so light commands (the scaling fitter) start without torch."""

from __future__ import annotations

import os

# OpenMP threads that spin-wait for each other collapse when another CPU-bound process shares
# the cores (training fell 20x at 2 threads). The policy is read once, when torch loads its
# OpenMP runtime, so it is set here, before anything in the package imports torch; a value the
# user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from typing import Any  # noqa: E402

from smelt_interp.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    MatchError,
    ProbeError,
    SmeltError,
    TokenError,
    TokenizerError,
)

__all__ = [
    "ModelConfig",
    "SmeltModel",
    "hook_name",
    "load_checkpoint",
    "save_checkpoint",
    "SmeltError",
    "ConfigError",
    "CheckpointError",
    "DataError",
    "TokenizerError",
    "TokenError",
    "MatchError",
    "ProbeError",
]
__version__ = "0.1.0"

_LAZY = {
    "ModelConfig": ("smelt_interp.config", "ModelConfig"),
    "SmeltModel": ("smelt_interp.model.transformer", "SmeltModel"),
    "hook_name": ("smelt_interp.model.protocol", "hook_name"),
    "load_checkpoint": ("smelt_interp.checkpoint", "load_checkpoint"),
    "save_checkpoint": ("smelt_interp.checkpoint", "save_checkpoint"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'smelt_interp' has no attribute {name!r}")
