"""The attention-sink positive control at reduced scale (docs/results/sink_control.md): one
layer, one head with learned absolute positions, backcopy triggers on bigram filler, parks its
head on BOS at the positions where it has nothing to copy; the same model on rows without
triggers parks nothing.

Measured (1 thread, 300 steps of 32 x 64 tokens, lr 1e-2; BOS mass at non-trigger queries):
seeds 0 / 1 read 0.58 / 0.64 with BOS value-norm ratio 0.38 / 0.33; without triggers 0.049
(uniform attention over 64 tokens gives 0.059); the same recipe with RoPE 0.19 (seed 0)."""

from __future__ import annotations

import torch
from helpers.tiny_runs import trained_once

from benchmarks.sink_control import onset_point
from smelt_interp.data.trigger import trigger_rows
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.trainer import Trainer

STEPS = 300
TINY_CONTROL = {
    "model": {
        "d_model": 32,
        "n_layers": 1,
        "n_heads": 1,
        "n_kv_heads": 1,
        "d_head": 32,
        "n_experts": 1,
        "top_k": 1,
        "d_expert": 128,
        "max_seq_len": 64,
        "positions": "learned",
    },
    "data": {"trigger": 1.0},
    "trigger": {"rate": 0.1, "kinds": ["backcopy"], "alphabet": 64, "filler": "bigram"},
    "seq_len": 64,
    "batch_size": 32,
    "lr": 1e-2,
    "beta2": 0.99,
    "weight_decay": 1e-4,
    **trained_once(STEPS),
}


def trained_head(tmp_path, rate: float) -> dict[str, float]:
    """The head's figures after training on rows with triggers at `rate`, on 32 held-out rows
    with triggers (rate 0.1), and the copy accuracy."""
    cfg = TrainConfig.from_dict(
        {**TINY_CONTROL, "trigger": {**TINY_CONTROL["trigger"], "rate": rate}}
    )
    trainer = Trainer(cfg, tmp_path / f"rate{rate}", progress=False)
    sched = cfg.lr_schedule(cfg.schedule.steps)
    while trainer.step < cfg.schedule.steps:
        trainer.train_step(sched(trainer.step))
    rows = trigger_rows(
        32, 64, seed=0, split="heldout", spec=TrainConfig.from_dict(TINY_CONTROL).corpus.trigger
    )
    point = onset_point(trainer.model, rows)
    return {**point["heads"]["0.0"], "copy_acc": point["copy_acc"]}


def test_a_one_head_backcopy_model_parks_on_bos_and_a_trigger_free_one_does_not(tmp_path):
    torch.manual_seed(0)
    head = trained_head(tmp_path, 0.1)
    assert head["copy_acc"] > 0.4  # measured 0.75: the head does copy at the triggers
    assert head["bos"] > 0.3, head  # measured 0.58 (seed 0), 0.64 (seed 1)
    assert head["vratio"] < 0.7, head  # measured 0.38, 0.33: a near no-op value at BOS
    idle = trained_head(tmp_path, 1e-6)  # no trigger in any training row
    assert idle["bos"] < 0.15, idle  # measured 0.049: spread, about uniform (0.059)
