"""smelt-interp: train compute-matched SMELT/Baseline MoE transformers and look inside them,
visit by visit."""
from smelt_interp.config import ModelConfig
from smelt_interp.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    MatchError,
    ProbeError,
    SmeltError,
    TokenizerError,
)
from smelt_interp.model.transformer import SmeltModel, hook_name

__all__ = [
    "ModelConfig",
    "SmeltModel",
    "hook_name",
    "SmeltError",
    "ConfigError",
    "CheckpointError",
    "DataError",
    "TokenizerError",
    "MatchError",
    "ProbeError",
]
__version__ = "0.1.0"
