"""The training state (state.pt) that `--resume` continues from: reading it with one clear
error for any fault, and the random generators' states, each restored on its own device.

The state is read onto the CPU whatever the training device: `load_state_dict` then copies the
weights and the optimizer's moments to the device the model lives on, and the CPU generator's
state stays the CPU ByteTensor `torch.set_rng_state` demands (read with
`map_location=<the GPU>` it would be a CUDA tensor, refused with a TypeError)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from smelt_interp.data.bpe import Tokenizer, tokenizer_hash, tokenizer_json
from smelt_interp.errors import CheckpointError, ConfigError
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.run_folder import load_training_state


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The CPU generator's state, and on CUDA the training device's generator's."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(saved: torch.Tensor | dict[str, torch.Tensor], device: torch.device) -> None:
    """Restore what `rng_state` saved (or a bare tensor: the CPU state alone), wherever
    `torch.load` mapped it."""
    states = saved if isinstance(saved, dict) else {"cpu": saved}
    torch.set_rng_state(states["cpu"].to("cpu", torch.uint8))
    if "cuda" in states and device.type == "cuda":
        torch.cuda.set_rng_state(states["cuda"].to("cpu", torch.uint8), device)


def run_record(cfg: TrainConfig, tokenizer: Tokenizer) -> dict[str, Any]:
    """What state.pt records of the run it continues: the training config, and the fingerprint
    of the tokenizer its tokens came from (a shards folder prepared again with another
    tokenizer of the same size has the same config, and would feed the model other tokens)."""
    return {
        "train_config": cfg.to_dict(),
        "tokenizer_hash": tokenizer_hash(tokenizer_json(tokenizer)),
    }


def read_state(path: Path, cfg: TrainConfig, tokenizer: Tokenizer | None = None) -> dict[str, Any]:
    """state.pt read onto the CPU, or a CheckpointError if it is unreadable, was saved by a
    run with another training config, or (with `tokenizer`, the data's) on tokens of another
    tokenizer. A state saved before states recorded a tokenizer is taken as it is."""
    state = load_training_state(path, "cpu")
    saved = state.get("tokenizer_hash")
    if tokenizer is not None and saved is not None:
        now = tokenizer_hash(tokenizer_json(tokenizer))
        if saved != now:
            raise CheckpointError(
                f"{path}: cannot resume, the run was trained on tokenizer {str(saved)[:12]} and "
                f"its data now give tokenizer {now[:12]} (prepared again?); resume on the "
                f"same shards, or start again without --resume"
            )
    try:
        same_run = TrainConfig.from_dict(state.get("train_config") or {}).same_run(cfg)
    except (AttributeError, ConfigError, TypeError):
        same_run = False
    if not same_run:
        raise CheckpointError(
            f"{path}: cannot resume, the run was started with a different training config"
        )
    return state
