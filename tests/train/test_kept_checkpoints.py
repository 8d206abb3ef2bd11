"""Kept early checkpoints (TrainConfig.keep_ckpts_until): a copy of each periodic checkpoint up
to that step, equal to what ckpt.pt held at the step (read from a run stopped just after it),
loadable on their own, not taken for runs by the dashboard's registry, and still right when
the run is resumed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.tiny_runs import TINY_MODEL, TINY_RUN

from smelt_interp.app.registry import ModelRegistry, find_checkpoints
from smelt_interp.checkpoint import load_checkpoint, read_info
from smelt_interp.provenance import CKPT_FILE
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import get_preset
from smelt_interp.train.run_folder import KEPT_DIR, kept_checkpoints, kept_ckpt_name
from smelt_interp.train.trainer import Trainer


def cfg(**over) -> TrainConfig:
    base = {**TINY_RUN, "model": TINY_MODEL, "steps": 10, "ckpt_every": 2, "dyck_eval_n": 0}
    return TrainConfig.from_dict({**base, "keep_ckpts_until": 5, **over})


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)[0].state_dict()


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def stop_after(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Make the trainer stop (as a kill would) when it is about to take step `step` + 1."""
    monkeypatch.undo()  # the trainer's own step, not an earlier patch of it
    original = Trainer.train_step

    def dying(self, lr):
        if self.step == step:
            raise KeyboardInterrupt("simulated kill")
        return original(self, lr)

    monkeypatch.setattr(Trainer, "train_step", dying)


def test_kept_checkpoints_are_ckpt_pt_at_their_steps(tmp_path, monkeypatch):
    Trainer(cfg(), tmp_path / "full", progress=False).run()
    kept = kept_checkpoints(tmp_path / "full")
    assert list(kept) == [2, 4]  # periodic saves at 2, 4, 6, 8; kept up to step 5
    assert kept[2] == tmp_path / "full" / KEPT_DIR / kept_ckpt_name(2)
    for step in kept:  # ckpt.pt of a run stopped right after that step's save
        stop_after(monkeypatch, step)
        with pytest.raises(KeyboardInterrupt):
            Trainer(cfg(), tmp_path / f"stop{step}", progress=False).run()
        held = tmp_path / f"stop{step}" / CKPT_FILE
        assert read_info(held).step == step == read_info(kept[step]).step
        assert same(weights(kept[step]), weights(held))
        assert not read_info(kept[step]).final
    assert not same(weights(kept[2]), weights(kept[4]))
    # resumed from step 2's state, the run writes the same kept checkpoint at step 4
    monkeypatch.undo()
    Trainer(cfg(), tmp_path / "stop2", resume=True, progress=False).run()
    again = kept_checkpoints(tmp_path / "stop2")
    assert list(again) == [2, 4]
    assert same(weights(again[4]), weights(kept[4]))
    assert same(weights(tmp_path / "stop2" / CKPT_FILE), weights(tmp_path / "full" / CKPT_FILE))


def test_the_registry_finds_one_run_and_opens_a_kept_file(tmp_path):
    Trainer(cfg(steps=6), tmp_path / "run", progress=False).run()
    assert find_checkpoints([tmp_path]) == {"run": tmp_path / "run" / CKPT_FILE}
    kept = kept_checkpoints(tmp_path / "run")[4]
    registry = ModelRegistry(find_checkpoints([kept]))
    (model,) = registry.models.values()
    assert same(model.state_dict(), weights(kept))


def test_a_fresh_run_drops_an_earlier_runs_kept_files(tmp_path):
    Trainer(cfg(keep_ckpts_until=8), tmp_path / "r", progress=False).run()
    assert list(kept_checkpoints(tmp_path / "r")) == [2, 4, 6, 8]
    Trainer(cfg(keep_ckpts_until=3, seed=1), tmp_path / "r", progress=False).run()
    assert list(kept_checkpoints(tmp_path / "r")) == [2]
    assert read_info(kept_checkpoints(tmp_path / "r")[2]).train_config["seed"] == 1


def test_no_kept_checkpoints_by_default_and_the_recall_preset_keeps_to_1000(tmp_path):
    Trainer(cfg(keep_ckpts_until=0, steps=4), tmp_path / "r", progress=False).run()
    assert kept_checkpoints(tmp_path / "r") == {}
    assert TrainConfig.from_dict(get_preset("recall-pair")).checkpoint.keep_until == 1000


def test_a_kept_checkpoints_stale_temp_file_is_removed_by_the_next_run(tmp_path):
    """A run killed while writing a kept copy leaves `.ckpt-NNNNNN.pt.<random>.tmp` in the kept
    folder (smelt_interp.files); the next run in the folder clears it, and only it."""
    Trainer(cfg(steps=4), tmp_path / "r", progress=False).run()
    stale = tmp_path / "r" / KEPT_DIR / f".{kept_ckpt_name(2)}.abc123.tmp"
    other = tmp_path / "r" / KEPT_DIR / "notes.txt"
    stale.write_bytes(b"half")
    other.write_text("mine")
    Trainer(cfg(steps=4), tmp_path / "r", resume=True, progress=False).run()
    assert not stale.exists() and other.read_text() == "mine"
    assert list(kept_checkpoints(tmp_path / "r")) == [2]
