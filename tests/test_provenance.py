"""One answer about a checkpoint (provenance.py): its task, its task's spec, its run
folder and metrics file, from the training config its run saved."""

from __future__ import annotations

from pathlib import Path

import pytest

from smelt_interp.checkpoint import CheckpointInfo
from smelt_interp.data.assoc_recall import AssocRecallSpec
from smelt_interp.data.dyck import DyckSpec
from smelt_interp.errors import CheckpointError
from smelt_interp.provenance import METRICS_FILE, Provenance, task_of_mix

RECALL_CONFIG = {
    "data": {"assoc_recall": 0.5, "dyck": 0.5},
    "assoc_recall": {"n_triggers": 5, "trigger_share": 0.25},
    "row_len": {"assoc_recall": 96},
    "seq_len": 128,
}


def test_the_task_is_recall_exactly_when_the_mix_gives_it_weight():
    assert task_of_mix({"assoc_recall": 0.5, "dyck": 0.5}) == "assoc_recall"
    assert task_of_mix({"assoc_recall": 0, "dyck": 1.0}) == "dyck"
    assert task_of_mix({"assoc_recall": "0.5"}) == "dyck"  # not a weight
    assert task_of_mix(None) == task_of_mix({}) == "dyck"
    assert Provenance(Path("a/ckpt.pt"), RECALL_CONFIG).task == "assoc_recall"
    assert Provenance(Path("a/ckpt.pt")).task == "dyck"


def test_the_task_spec_is_the_one_the_run_saved():
    recall = Provenance(Path("r/ckpt.pt"), RECALL_CONFIG)
    assert recall.task_spec == recall.recall_spec
    assert recall.recall_spec.trigger_ids == (16, 17, 18, 19, 20)
    assert recall.recall_spec.trigger_share == 0.25
    assert recall.row_len() == recall.row_len("assoc_recall") == 96
    assert recall.row_len("dyck") == 128  # no row_len of its own: the run's seq_len
    dyck = Provenance(Path("d/ckpt.pt"), {"data": {"dyck": 1.0}, "dyck": {"n_pairs": 2}})
    assert dyck.task_spec == dyck.dyck_spec == DyckSpec.from_mapping({"n_pairs": 2})
    assert dyck.recall_spec == AssocRecallSpec()  # not its task: the default
    bare = Provenance(Path("x.pt"))
    assert bare.dyck_spec == DyckSpec() and bare.row_len() is None


def test_a_recall_checkpoint_without_its_spec_is_an_error_not_a_default():
    lost = Provenance(Path("r/ckpt.pt"), {"data": {"assoc_recall": 1.0}})
    with pytest.raises(CheckpointError, match="records no assoc_recall spec"):
        _ = lost.task_spec
    bad = Provenance(Path("r/ckpt.pt"), {**RECALL_CONFIG, "assoc_recall": {"n_triggers": -1}})
    with pytest.raises(CheckpointError, match="assoc_recall spec is invalid"):
        _ = bad.recall_spec


def test_the_run_folder_and_metrics_file_for_a_file_and_a_folder():
    info = CheckpointInfo(path=Path("runs/pair/smelt/ckpt.pt"), train_config=RECALL_CONFIG)
    of_file = Provenance.of(info)
    assert of_file.run_folder == Path("runs/pair/smelt")
    assert of_file.metrics_file == Path("runs/pair/smelt") / METRICS_FILE
    of_folder = Provenance(Path("runs/pair/smelt"))  # a run still without a checkpoint
    assert of_folder.metrics_file == of_file.metrics_file
