"""The seconds-long Dyck training run that trainer tests share (test_train, test_fsdp): one
bracket pair nested at most twice, on 64-token rows, with evaluation left to the final step;
and the tiny model shape they train (TINY_MODEL)."""

from __future__ import annotations

from typing import Any

TINY_MODEL: dict[str, Any] = {
    "d_model": 32,
    "n_layers": 4,
    "n_heads": 2,
    "n_kv_heads": 1,
    "d_head": 16,
    "n_experts": 4,
    "top_k": 2,
    "d_expert": 32,
    "max_seq_len": 128,
}

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


def trained_once(steps: int, warmup: int = 10) -> dict[str, Any]:
    """A constant rate after `warmup` for `steps` steps, one evaluation and one checkpoint at the
    end, on one thread: the schedule of the sink and recall controls, which read the model only
    once training is done."""
    return {
        "warmup_steps": warmup,
        "steps": steps,
        "decay_fraction": 0.0,
        "eval_every": steps,
        "ckpt_every": steps,
        "dyck_eval_n": 0,
        "eval_rows": 4,
        "threads": 1,
    }
