"""FSDP2 for the trainer (`--set parallel=fsdp` under torchrun): parameters, gradients and
optimizer state sharded across ranks with `torch.distributed.fsdp.fully_shard`, one unit per
Block and one for the rest (embedding, final norm, unembedding) at the root.

Checkpoints are gathered, not distributed (DCP). Saving collects the full model and optimizer
state on rank 0 (on CPU) and writes it through the usual checkpoint writer. The result is one
`ckpt.pt` that the probes, the app and `load_checkpoint` already read, in one process and with
`torch.load(weights_only=True)`. The models here are small enough that gathering them is cheap.
A DCP folder of shards would need a conversion step before any probe could open it. Resume loads
the full state on every rank (from the CPU) and each rank keeps its own shard."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from smelt_interp.model.transformer import SmeltModel

GATHERED = StateDictOptions(full_state_dict=True, cpu_offload=True)
FULL = StateDictOptions(full_state_dict=True)


def mixed_precision(device: torch.device) -> MixedPrecisionPolicy:
    """On CUDA, all-gather and compute in bf16 (the step runs under bf16 autocast anyway) and
    reduce the gradients in float32, so the reduction over ranks does not round to bf16; on
    CPU, float32 throughout."""
    if device.type == "cuda":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_model(model: SmeltModel, device: torch.device) -> SmeltModel:
    """Shard `model` in place over every rank of the process group (each Block its own unit,
    so at most one Block's full weights are gathered at a time); returns it."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = mixed_precision(device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor, or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    """The whole value of a DTensor (a collective: every rank calls it), or the tensor itself."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def gathered_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict on rank 0's CPU (empty on the other ranks); every rank calls it."""
    return get_model_state_dict(model, options=GATHERED)


def gathered_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """{"model", "optimizer"}: full states on rank 0's CPU, parameters keyed by name (empty on
    the other ranks); every rank calls it."""
    return {
        "model": gathered_model_state(model),
        "optimizer": get_optimizer_state_dict(model, optimizer, options=GATHERED),
    }


def load_full_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
) -> None:
    """Load full states (as `gathered_state` saved them, read on every rank) into the sharded
    model and its optimizer: each rank keeps its shard. Every rank calls it."""
    set_model_state_dict(model, model_state, options=FULL)
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=FULL)
