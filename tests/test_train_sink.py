"""Issue 10's must-show: a tiny model trained on trigger tasks grows attention sinks on heads the
task leaves idle, and a tiny model of the same shape trained on Dyck does not.

One layer of 8 heads, 64-token rows, backcopy and skip-copy triggers (data.trigger) at rate 0.2
over a 26-character filler: two heads suffice for the copies, so most heads have nothing to do
at most positions. Measured with the sink probe (Sink^0.3 on 64-token windows of 32 held-out
rows), 400 steps, seeds 0..3 (every seed measured; none left out):

    trigger  Sink^0.3 0.000 / 0.250 / 0.625 / 0.375   (mean over seeds 0..2: 0.29)
             heaviest head 0.05 / 0.84 / 0.58 / 1.00
    dyck     Sink^0.3 0.000 / 0.000 / 0.000   (seeds 0..2; heaviest head 0.10 / 0.22 / 0.07)

Whether a given seed's model parks a head depends on whether it learned the copies early, so the
test pools three seeds. The BOS value-norm ratio of the sink heads is not asserted: it ranged
0.19-2.62 (below 1, the dormant-head signature, for about half of them)."""

from __future__ import annotations

import pytest

from smelt_interp.probes import sink
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.trainer import Trainer

SEEDS = (0, 1, 2)
STEPS = 400


def train_tiny(domain: str, seed: int, tmp_path) -> tuple[float, float]:
    """(Sink^0.3 on 64-token windows, heaviest head's BOS mass) of a tiny model trained on
    `domain` alone, on 32 held-out rows of that domain."""
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
            "warmup_steps": 10,
            "steps": STEPS,
            "decay_fraction": 0.0,
            "eval_every": STEPS,
            "ckpt_every": STEPS,
            "dyck_eval_n": 0,
            "eval_rows": 4,
            "seed": seed,
            "threads": 1,
        }
    )
    trainer = Trainer(cfg, tmp_path / f"{domain}{seed}", progress=False)
    trainer.run()
    heads = sink.measure(trainer.model.eval(), trainer.data.heldout(domain, 32))
    return float(heads["is_sink_64"].mean()), float(heads["sink_mass_64"].max())


@pytest.mark.slow
def test_a_trigger_task_grows_a_dormant_sink_head_that_dyck_does_not(tmp_path):
    trigger = [train_tiny("trigger", seed, tmp_path) for seed in SEEDS]
    dyck = [train_tiny("dyck", seed, tmp_path) for seed in SEEDS[:2]]
    trigger_share = sum(s for s, _ in trigger) / len(trigger)
    # measured 0.29 (0 / 0.25 / 0.625); a sink in two of three seeds
    assert trigger_share >= 0.15, trigger
    assert sum(s > 0 for s, _ in trigger) >= 2, trigger
    assert max(m for _, m in trigger) > 0.5, trigger  # measured 0.84
    # measured 0 and 0 with heaviest heads 0.10 and 0.22; uniform attention gives 0.059
    assert all(s == 0 for s, _ in dyck), dyck
    assert max(m for _, m in dyck) < 0.3, dyck
