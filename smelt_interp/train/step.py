"""One optimizer step, with no read back to the host.

The step's metrics (language-model loss, load balance, z-loss, gradient norm) stay on the
device as one small tensor; `MetricWindow` collects them and reads a window of steps at once
(one sync), which is where a non-finite loss or gradient norm is found. Whoever saves anything
reads the window first, so no checkpoint ever follows a non-finite step unnoticed."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from smelt_interp.errors import TrainingDiverged
from smelt_interp.train import parallel
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.distributed import DistEnv, all_reduce_mean
from smelt_interp.train.evaluate import lm_loss

METRICS = ("loss", "load_balance", "z_loss", "grad_norm")

MicroBatch = Sequence[tuple[torch.Tensor, int]]  # (tokens on the device, targets) per length


def optimizer_step(
    model: torch.nn.Module,
    forward_model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Callable[[int], MicroBatch],
    cfg: TrainConfig,
    env: DistEnv,
    autocast: Callable[[], AbstractContextManager],
) -> torch.Tensor:
    """Forward and backward over every micro-batch (`micro_batches(i)`), clip, update; the
    metrics [loss, load_balance, z_loss, grad_norm] on the device.

    One forward per row length; each weighs by its share of the micro-batch's targets (counted
    on the CPU), so the loss is the token mean over all its parts."""
    grad_accum = cfg.batch.grad_accum
    totals = None
    for micro in range(grad_accum):
        groups = micro_batches(micro)
        n_targets = sum(t for _, t in groups)
        for i, (tokens, targets) in enumerate(groups):
            share = targets / max(n_targets, 1) if len(groups) > 1 else 1.0
            last = micro == grad_accum - 1 and i == len(groups) - 1
            sync = nullcontext()
            if env.enabled and not last and hasattr(forward_model, "no_sync"):
                sync = forward_model.no_sync()
            with sync:
                with autocast():
                    logits = forward_model(tokens, ids_checked=True)
                    lm = lm_loss(logits, tokens)
                aux = model.aux_losses
                loss = (
                    lm
                    + cfg.optim.load_balance_coef * aux["load_balance"]
                    + cfg.optim.z_loss_coef * aux["z_loss"]
                )
                (loss * share / grad_accum).backward()
            part = torch.stack([lm.detach(), aux["load_balance"].detach(), aux["z_loss"].detach()])
            totals = share * part if totals is None else totals + share * part
    assert totals is not None
    totals = all_reduce_mean(totals.float() / grad_accum, env)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
    grad_norm = parallel.full_value(grad_norm)  # sharded: the norm over every rank's shard
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return torch.cat([totals, grad_norm.detach().float().reshape(1).to(totals.device)])


class StepResult(Mapping[str, float]):
    """One step's metrics by name, on the device until a value is asked for (that read is a
    host sync; the training loop never asks, it hands the tensor to a MetricWindow)."""

    def __init__(self, values: torch.Tensor, lr: float) -> None:
        self.values = values
        self.lr = lr
        self._read: dict[str, float] | None = None

    def _floats(self) -> dict[str, float]:
        if self._read is None:
            self._read = {**dict(zip(METRICS, self.values.tolist())), "lr": self.lr}
        return self._read

    def __getitem__(self, key: str) -> float:
        return self._floats()[key]

    def __iter__(self) -> Iterator[str]:
        return iter((*METRICS, "lr"))

    def __len__(self) -> int:
        return len(METRICS) + 1


@dataclass
class _Pending:
    step: int  # optimizer steps done after it
    values: torch.Tensor
    lr: float
    extra: dict[str, Any]


@dataclass
class MetricWindow:
    """Step metrics waiting on the device; `read` fetches them all in one sync and raises
    TrainingDiverged at the first step whose loss or gradient norm is not finite."""

    kept: Callable[[], str]  # what the error says was kept ("the last good checkpoint ...")
    pending: list[_Pending] = field(default_factory=list)

    def add(self, step: int, result: StepResult, **extra: Any) -> None:
        self.pending.append(_Pending(step, result.values, result.lr, extra))

    def __len__(self) -> int:
        return len(self.pending)

    def read(self) -> list[dict[str, Any]]:
        """The waiting steps' records ({"step", metrics, "lr", extra}), oldest first."""
        if not self.pending:
            return []
        rows = torch.stack([p.values for p in self.pending]).tolist()
        pending, self.pending = self.pending, []
        records = []
        for p, row in zip(pending, rows):
            metrics = dict(zip(METRICS, row))
            where = f"at step {p.step - 1} (lr {p.lr:.3g}); stopped, {self.kept()}"
            if not math.isfinite(metrics["loss"]):
                raise TrainingDiverged(f"loss became {metrics['loss']} {where}")
            if not math.isfinite(metrics["grad_norm"]):
                raise TrainingDiverged(
                    f"gradient norm became {metrics['grad_norm']} (non-finite) {where}"
                )
            records.append({"step": p.step, **metrics, "lr": p.lr, **p.extra})
        return records
