"""The sink probe from one forward pass per micro-batch: its table (every figure of the probe is
drawn from it) equals the one the probe gave when it ran a second, `hook_pattern`, pass for the
64-token window (tests/data/sink_tables_two_pass.json, written by that code on these models
and rows), and a forward hook counts one model call per micro-batch."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from smelt_interp.probes import sink

BEFORE = Path(__file__).parent.parent / "data" / "sink_tables_two_pass.json"
LENGTHS = [100, 40, 70, 12, 90]  # rows past and short of the 64-token window, padded
BATCH = 2  # three micro-batches


@pytest.mark.parametrize("name", ["smelt", "baseline"])
def test_the_table_is_the_two_pass_one(name, make_cfg, make_model, make_tokens):
    cfg = make_cfg(looped=name == "smelt", max_seq_len=128, init_std=0.3)
    model = make_model(cfg, seed=3)
    tokens, lengths = (
        make_tokens(len(LENGTHS), max(LENGTHS), seed=5, cfg=cfg),
        torch.tensor(LENGTHS),
    )
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        got = sink.measure(model, tokens, lengths, batch_size=BATCH, chunk=16)
    finally:
        handle.remove()
    assert len(calls) == -(-len(LENGTHS) // BATCH)  # one forward pass per micro-batch
    before = json.loads(BEFORE.read_text())[name]
    want = pd.DataFrame(before["data"], columns=before["columns"])
    # Gu's Sink^0.3 columns came later; tests/measure/test_sink_gu.py holds them to a reference
    added = ["first_key_importance_64", "sink03_gu"]
    assert [c for c in got.columns if c not in added] == list(want.columns)
    for column in want.columns:
        if want[column].dtype == bool or column in ("layer", "visit", "depth", "head"):
            assert got[column].tolist() == want[column].tolist(), column
        else:  # the window was read from hook_pattern then; now from the same Q/K recompute
            assert got[column].to_numpy() == pytest.approx(want[column].to_numpy(), abs=1e-6)
