"""A tiny model trained on associative recall grows one head that parks on BOS at non-answer
positions and retrieves the demonstration answers at answer positions; the same model trained on
control rows, where every occurrence of the trigger draws a fresh successor, grows no
retrieval.

Two layers of 4 heads (each with its own K/V), 64-token rows with one trigger at a 0.2 share,
lr 1e-2, weight decay 0.5 (the level that grows sinks fastest at this size, see
tests/train/test_train_sink.py), 400 steps of 32 rows (819k tokens, about 30 s of one CPU thread).
Measured with the case study's reducer (probes.head_ablation.head_masses) on 32 held-out rows of
the repeating task, every seed measured and none left out:

    seed 0   retrieval head L1h3: demo mass 0.820, non-answer BOS mass 0.226; accuracy 0.989
    seed 1   retrieval head L1h2: demo mass 0.878, non-answer BOS mass 0.316; accuracy 1.000
             (the parked head of seed 1 is the same head; seed 0's parks at 0.243 in L1h0)
    control  best demo mass 0.169 (what attention to recent tokens puts there), accuracy 0.000

    ablation: mean-ablating every head with demo mass >= 0.5 (L1h0, L1h2, L1h3 in both seeds)
             takes answer accuracy from 0.989 / 1.000 to 0.076 / 0.181; ablating the parked
             head changes non-answer loss by +0.0013 / -0.0005 nats

Chance is 1/26. The thresholds sit at about half of the pooled measurement (demo mass 0.85,
BOS mass 0.27 in the retrieval head)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from helpers.tiny_runs import trained_once

from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_positions, recall_rows
from smelt_interp.probes.head_ablation import ablate_heads, answer_accuracy, head_masses
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.trainer import Trainer

SEEDS = (0, 1)
STEPS = 400
ROW_LEN = 64
SPEC = AssocRecallSpec(n_triggers=1, trigger_share=0.2)


def train_tiny(seed: int, repeat: bool, tmp_path) -> tuple[pd.DataFrame, float, pd.DataFrame]:
    """(head_masses, answer accuracy, the head ablation's table) of a tiny model trained on
    recall rows (or on control rows, repeat=False), measured on 32 held-out rows of the
    repeating task."""
    spec = {"n_triggers": SPEC.n_triggers, "trigger_share": SPEC.trigger_share}
    cfg = TrainConfig.from_dict(
        {
            "model": {
                "d_model": 64,
                "n_layers": 2,
                "n_heads": 4,
                "n_kv_heads": 4,
                "d_head": 16,
                "n_experts": 4,
                "top_k": 2,
                "d_expert": 64,
                "max_seq_len": 128,
            },
            "data": {"assoc_recall": 1.0},
            "assoc_recall": {**spec, "repeat_successor": repeat},
            "seq_len": ROW_LEN,
            "batch_size": 32,
            "lr": 1e-2,
            "weight_decay": 0.5,
            **trained_once(STEPS, warmup=50),
            "seed": seed,
        }
    )
    trainer = Trainer(cfg, tmp_path / f"recall-{seed}-{repeat}", progress=False)
    trainer.run()
    model = trainer.model.eval()
    rows = recall_rows(32, ROW_LEN, 0, split="heldout", spec=SPEC)
    with torch.no_grad():
        logits = model(rows)
    accuracy = answer_accuracy(logits, recall_positions(rows, SPEC.trigger_ids))
    masses = head_masses(model, rows, SPEC.trigger_ids)
    return masses, accuracy, ablate_heads(model, rows, SPEC, masses).table.set_index("run")


@pytest.mark.slow
def test_recall_grows_a_head_that_parks_and_retrieves_and_control_rows_do_not(tmp_path):
    trained = [train_tiny(seed, True, tmp_path) for seed in SEEDS]
    control, control_acc, _ = train_tiny(0, False, tmp_path)
    retrieval = [masses.loc[masses["demo_mass"].idxmax()] for masses, _, _ in trained]
    shown = [
        (r["layer"], r["head"], round(r["demo_mass"], 3), round(r["bos_mass"], 3))
        for r in retrieval
    ]
    shown_acc = [round(acc, 3) for _, acc, _ in trained]
    demo = sum(r["demo_mass"] for r in retrieval) / len(retrieval)
    bos = sum(r["bos_mass"] for r in retrieval) / len(retrieval)
    # the head that retrieves most is also the one that parks: both in one head, pooled
    assert demo >= 0.42, (shown, shown_acc)
    assert bos >= 0.13, (shown, shown_acc)
    assert min(acc for _, acc, _ in trained) >= 0.8, shown_acc
    # mean-ablating the heads that retrieve takes most of the accuracy away; a parked head (one
    # that meets the sink definition) writes next to nothing where it parks, so ablating it
    # leaves non-answer loss as it was; where no head meets it, nothing is ablated and the
    # table says so
    for _, _, table in trained:
        team = table.loc["retrieval heads ablated"]
        assert team["answer_acc"] <= 0.35, table["answer_acc"].to_dict()
        parked = table.loc["parked head ablated"]
        if pd.isna(parked["non_answer_loss_change"]):
            assert "no head" in parked["note"], parked.to_dict()
        else:
            assert abs(parked["non_answer_loss_change"]) <= 0.02, parked.to_dict()
    # control rows give nothing to recall: no head retrieves, and answers stay near chance
    assert control["demo_mass"].max() <= 0.25, control["demo_mass"].max()
    assert control_acc <= 0.15, control_acc
