"""The seconds-long Dyck training run that trainer tests share (test_train, test_fsdp): one
bracket pair nested at most twice, on 64-token rows, with evaluation left to the final step."""

from __future__ import annotations

from typing import Any

TINY_RUN: dict[str, Any] = {
    "data": {"dyck": 1.0},
    "dyck": {"n_pairs": 1, "max_depth": 2, "min_len": 2, "max_len": 6},
    "seq_len": 64,
    "batch_size": 4,
    "lr": 3e-3,
    "warmup_steps": 2,
    "eval_every": 1000,
    "eval_rows": 2,
}
