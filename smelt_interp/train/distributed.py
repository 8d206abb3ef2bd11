"""The process group under `torchrun` (NCCL on GPUs, gloo on CPU), for DDP and FSDP alike.

A process joins the group once, on the first Trainer, and leaves it when it exits: the Baseline
and SMELT runs of a pair (or the runs of a ladder) share it. Destroying and re-creating the group
between them is what hung a sharded SMELT run after its Baseline."""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def init_distributed(device_type: str) -> DistEnv:
    """Join the process group torchrun describes in the environment, if any."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistEnv()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
        atexit.register(_leave)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        torch.cuda.set_device(local)
    return DistEnv(dist.get_rank(), dist.get_world_size(), local)


def is_launch_main() -> bool:
    """Whether this process is torchrun's rank 0 (or runs alone): the one that prints."""
    return os.environ.get("RANK", "0") == "0"


def _leave() -> None:
    """Leave the process group at exit (NCCL warns about a group left alive)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_mean(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.enabled:
        value = value.clone()
        dist.all_reduce(
            value, op=dist.ReduceOp.AVG if dist.get_backend() == "nccl" else dist.ReduceOp.SUM
        )
        if dist.get_backend() != "nccl":
            value /= env.world_size
    return value
