"""The Overview's sink measures each model on its own task's rows: a recall checkpoint on
held-out recall rows of the spec it trained on, a Dyck checkpoint on the report's Dyck
documents. The reference is the sink probe run directly on rows built from the checkpoint's
saved spec, without the dashboard."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from smelt_interp.app.pages import overview
from smelt_interp.app.pages.case_study.recall import recall_row
from smelt_interp.app.probe_tables import model_tables, probe_inputs
from smelt_interp.app.registry import ModelRegistry
from smelt_interp.app.served import Served
from smelt_interp.checkpoint import load_checkpoint, save_checkpoint
from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_rows
from smelt_interp.errors import CheckpointError
from smelt_interp.probes import sink
from smelt_interp.probes.inputs import ProbeRequest, lengths_of

RECALL_SPEC = {"n_triggers": 3, "trigger_share": 0.4}  # not the default, so the spec must be read
N_ROWS, SEQ_LEN = 3, 32


@pytest.fixture
def served(tmp_path, make_cfg, make_model):
    recall = save_checkpoint(
        tmp_path / "recall" / "ckpt.pt",
        make_model(make_cfg(looped=True), seed=1),
        train_config={"data": {"assoc_recall": 1.0}, "assoc_recall": RECALL_SPEC},
    )
    dyck = save_checkpoint(
        tmp_path / "dyck" / "ckpt.pt",
        make_model(make_cfg(looped=False), seed=2),
        train_config={"data": {"dyck": 1.0}},
    )
    request = ProbeRequest(n_seqs=N_ROWS, seq_len=SEQ_LEN)
    return {"recall": recall, "dyck": dyck}, Served(
        ModelRegistry({"recall": recall, "dyck": dyck}), probe_request=request
    )


def test_a_recall_checkpoints_overview_sink_is_the_sink_probe_on_its_own_rows(served):
    paths, wb = served
    drawn = overview.own_task_sink(wb)
    model, _ = load_checkpoint(paths["recall"])
    rows = recall_rows(
        N_ROWS, SEQ_LEN, 0, split="heldout", spec=AssocRecallSpec.from_mapping(RECALL_SPEC)
    )
    expected = sink.by_visit(sink.measure(model, rows, lengths_of(rows)))
    pd.testing.assert_frame_equal(drawn["recall"], expected, atol=1e-9, rtol=0)
    on_dyck = model_tables(wb, "sink", "recall")["visits"]  # what the Overview drew before
    assert not np.allclose(on_dyck["sink_mass"], expected["sink_mass"])


def test_a_dyck_checkpoint_stays_on_the_reports_dyck_documents(served):
    _, wb = served
    drawn = overview.own_task_sink(wb)
    pd.testing.assert_frame_equal(drawn["dyck"], model_tables(wb, "sink", "dyck")["visits"])
    tokens, _ = probe_inputs(wb).batch()
    assert probe_inputs(wb).data == "dyck" and tokens.shape == (N_ROWS, SEQ_LEN)


def test_a_recall_checkpoint_without_its_spec_is_refused_not_defaulted(
    tmp_path, make_cfg, make_model
):
    path = save_checkpoint(
        tmp_path / "ckpt.pt", make_model(make_cfg()), train_config={"data": {"assoc_recall": 1.0}}
    )
    wb = Served(ModelRegistry({"recall": path}))
    with pytest.raises(CheckpointError, match="records no assoc_recall spec"):
        overview.own_task_sink(wb)
    with pytest.raises(CheckpointError, match="records no assoc_recall spec"):
        recall_row(wb, "recall", 0)
