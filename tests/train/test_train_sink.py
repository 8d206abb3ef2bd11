"""A tiny model trained on trigger tasks grows attention sinks on heads the
task leaves idle, and a tiny model of the same shape trained on Dyck does not.

One layer of 8 heads, 64-token rows, backcopy and skip-copy triggers (data.trigger) at rate 0.2
over a 26-character filler: two heads suffice for the copies, so most heads have nothing to do
at most positions. Measured with the sink probe (Sink^0.3 on 64-token windows of 32 held-out
rows), 400 steps, fused AdamW, every seed measured and none left out:

    trigger seeds 0..7  Sink^0.3 0 / 0.125 / 0.25 / 0.25 / 0.5 / 0.625 / 0.125 / 0.375
                        heaviest head 0.06 / 0.93 / 0.83 / 1.00 / 0.86 / 1.00 / 0.85 / 0.86
                        BOS value-norm ratio of the heads above 0.3, seeds 1..3: 0.34; 0.16,
                        0.16; 0.86, 0.86 (below 1: the dormant-head signature)
    dyck seeds 0..3     Sink^0.3 0 / 0 / 0 / 0; heaviest head 0.07 / 0.15 / 0.06 / 0.08

Whether a seed's model parks a head depends on whether it learned the copies early, and a change
of float rounding (the optimizer's) moves single seeds a lot (seed 2 read 0.625 with the
per-parameter AdamW), so the test pools four seeds and its thresholds sit at about half of what
seeds 0..3 gave."""

from __future__ import annotations

import pandas as pd
import pytest
from helpers.tiny_runs import trained_once

from smelt_interp.probes import sink
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.trainer import Trainer

SEEDS = (0, 1, 2, 3)
STEPS = 400


def train_tiny(domain: str, seed: int, tmp_path) -> pd.DataFrame:
    """The sink probe's per-head table for a tiny model trained on `domain` alone, measured on
    32 held-out rows of that domain."""
    cfg = TrainConfig.from_dict(
        {
            "model": {
                "d_model": 64,
                "n_layers": 1,
                "n_heads": 8,
                "n_kv_heads": 4,
                "d_head": 8,
                "n_experts": 2,
                "top_k": 1,
                "d_expert": 64,
                "max_seq_len": 128,
            },
            "data": {domain: 1.0},
            "trigger": {"rate": 0.2, "alphabet": 26, "kinds": ["backcopy", "skipcopy"]},
            "dyck": {"n_pairs": 4, "max_depth": 8, "min_len": 2, "max_len": 40},
            "seq_len": 64,
            "batch_size": 32,
            "lr": 1e-2,
            "weight_decay": 0.5,
            **trained_once(STEPS),
            "seed": seed,
        }
    )
    trainer = Trainer(cfg, tmp_path / f"{domain}{seed}", progress=False)
    trainer.run()
    return sink.measure(trainer.model.eval(), trainer.data.heldout(domain, 32))


@pytest.mark.slow
def test_a_trigger_task_grows_a_dormant_sink_head_that_dyck_does_not(tmp_path):
    trigger = [train_tiny("trigger", seed, tmp_path) for seed in SEEDS]
    dyck = [train_tiny("dyck", seed, tmp_path) for seed in SEEDS[:2]]
    shares = [float(heads["is_sink_64"].mean()) for heads in trigger]
    # measured 0 / 0.125 / 0.25 / 0.25 (mean 0.16): a sink in three of four seeds
    assert sum(shares) / len(shares) >= 0.08, shares
    assert sum(share > 0 for share in shares) >= 2, shares
    sinks = pd.concat([heads[heads["sink_mass_64"] > 0.3] for heads in trigger])
    assert sinks["sink_mass_64"].max() > 0.5  # measured 1.00
    # the dormant signature: a small value at BOS; measured median 0.34 over five sink heads
    assert sinks["v_norm_ratio"].median() < 0.7, sinks["v_norm_ratio"].tolist()
    # measured 0 and 0 with heaviest heads 0.07 and 0.15; uniform attention gives 0.059
    assert all(not heads["is_sink_64"].any() for heads in dyck)
    assert max(float(heads["sink_mass_64"].max()) for heads in dyck) < 0.3
