"""Training batches built ahead of the step that needs them, in a background thread.

A step's micro-batches are a pure function of (step, micro) (train/data.py), so the thread can
build the next ones while the device runs the current step: it groups the parts by row length,
counts each group's targets and checks the token ids, all on the CPU tensors (no read back from
the device), and on CUDA pins them, so the copy to the device is asynchronous (`non_blocking`).
A key asked for out of order (after a decay branch rewinds the step) is built on the spot."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.errors import TokenError
from smelt_interp.train.data import TrainingData, by_length

DEPTH = 2  # micro-batches built ahead


@dataclass(frozen=True)
class Group:
    """Rows of one length of one micro-batch, on the CPU (pinned on CUDA), and their targets."""

    tokens: torch.Tensor
    targets: int


def check_ids(tokens: torch.Tensor, vocab_size: int) -> None:
    """TokenError unless every id lies in 0..vocab_size - 1 (on the CPU tensor: no sync)."""
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= vocab_size:
        raise TokenError(f"token ids must lie in 0..{vocab_size - 1}, got {lo}..{hi}")


class BatchPrefetcher:
    """Builds (step, micro) micro-batches ahead; `get` returns one as device tensors."""

    def __init__(
        self, data: TrainingData, grad_accum: int, vocab_size: int, device: torch.device
    ) -> None:
        self.data = data
        self.grad_accum = grad_accum
        self.vocab_size = vocab_size
        self.device = device
        self.pin = device.type == "cuda"
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smelt-batches")
        self._pending: dict[tuple[int, int], Future[list[Group]]] = {}

    def build(self, step: int, micro: int) -> list[Group]:
        """The micro-batch's groups on the CPU, checked and counted."""
        groups = []
        for rows in by_length(self.data.batch_parts(step, micro)):
            check_ids(rows, self.vocab_size)
            targets = int((rows[:, 1:] != PAD_ID).sum())
            groups.append(Group(rows.pin_memory() if self.pin else rows, targets))
        return groups

    def _next(self, step: int, micro: int) -> tuple[int, int]:
        return (step, micro + 1) if micro + 1 < self.grad_accum else (step + 1, 0)

    def get(self, step: int, micro: int) -> list[tuple[torch.Tensor, int]]:
        """(tokens on the device, targets) per row length of micro-batch (step, micro); queues
        the next DEPTH micro-batches."""
        key = (step, micro)
        stale = [k for k in self._pending if k < key]
        for k in stale:  # a rewound or skipped key: never asked for again in order
            self._pending.pop(k).cancel()
        future = self._pending.pop(key, None)
        groups = future.result() if future is not None else self.build(step, micro)
        ahead = key
        for _ in range(DEPTH):
            ahead = self._next(*ahead)
            if ahead not in self._pending:
                self._pending[ahead] = self._pool.submit(self.build, *ahead)
        return [(g.tokens.to(self.device, non_blocking=self.pin), g.targets) for g in groups]

    def close(self) -> None:
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=True)
