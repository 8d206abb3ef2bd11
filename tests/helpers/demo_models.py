"""Checkpoints served as `make demo` serves its models: the recall pair (64-token context,
trained on associative recall) first, then the Dyck pair (512 tokens), under the demo's names,
with random tiny weights (what a page opens on is under test, not what the models learned) and
a short training log beside each, so the Runs page has curves to draw."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from smelt_interp.checkpoint import save_checkpoint
from smelt_interp.config import ModelConfig
from smelt_interp.model.transformer import SmeltModel

TINY = dict(d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_head=8, n_experts=4, top_k=2)
RECALL = {"n_triggers": 1, "trigger_share": 0.2, "alphabet": 26}
RECALL_CONFIG = {"data": {"assoc_recall": 1.0}, "assoc_recall": RECALL, "seq_len": 64}
DYCK_CONFIG = {"data": {"dyck": 1.0}, "seq_len": 320}
DEMO_MODELS = (  # name, looped, context, training config: in the demo's order
    ("smelt-recall", True, 64, RECALL_CONFIG),
    ("baseline-recall", False, 64, RECALL_CONFIG),
    ("smelt", True, 512, DYCK_CONFIG),
    ("baseline", False, 512, DYCK_CONFIG),
)
NAMES = tuple(name for name, *_ in DEMO_MODELS)


def demo_checkpoints(root: Path) -> dict[str, Path]:
    """{name: ckpt.pt} of the demo's four models under `root`, each in a run folder of its own
    with a three-record metrics.jsonl."""
    paths = {}
    for i, (name, looped, context, config) in enumerate(DEMO_MODELS):
        fields = {**TINY, "d_expert": 16, "max_seq_len": context, "init_std": 0.3}
        cfg = ModelConfig.smelt(**fields) if looped else ModelConfig.baseline(**fields)
        torch.manual_seed(i)
        path = save_checkpoint(root / name / "ckpt.pt", SmeltModel(cfg).eval(), train_config=config)
        records = [{"event": "train", "step": s, "loss": 5.0 - s / 10} for s in (1, 2, 3)]
        (path.parent / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        paths[name] = path
    return paths
