"""`loop_lr_scale`: a SMELT model's looped blocks train at their own multiple of the rate.

The reference is AdamW's first step, computed by hand: with zero moments and bias correction,
an element with gradient g moves by lr * |g| / (|g| + eps), so (weight decay off) the largest
move in a tensor whose gradient is far above eps is its group's rate, to float32 rounding."""

from __future__ import annotations

import pytest
import torch
from test_kept_checkpoints import stop_after

from smelt_interp.errors import ConfigError
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import get_preset
from smelt_interp.train.trainer import Trainer, pair_configs

LR = 1e-3


def tiny(arch: str, **over) -> TrainConfig:
    return TrainConfig.from_dict({**get_preset("dyck-pair-tiny"), "arch": arch, **over})


def first_step_moves(cfg: TrainConfig, tmp_path) -> dict[str, float]:
    """The largest |change| of each parameter tensor after one step at rate LR."""
    trainer = Trainer(cfg, tmp_path / cfg.arch, progress=False)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train_step(LR)
    return {
        name: (p.detach() - before[name]).abs().max().item()
        for name, p in trainer.model.named_parameters()
    }


def looped(name: str, cfg: TrainConfig) -> bool:
    model = cfg.model_config()
    return any(name.startswith(f"blocks.{i}.") for i in range(model.loop_start, model.loop_end))


def test_looped_blocks_move_at_their_scaled_rate(tmp_path):
    cfg = tiny("smelt", loop_lr_scale=0.25, weight_decay=0.0)
    moves = first_step_moves(cfg, tmp_path)
    assert any(looped(name, cfg) for name in moves) and not all(looped(n, cfg) for n in moves)
    for name, move in moves.items():
        want = LR * (0.25 if looped(name, cfg) else 1.0)
        assert move == pytest.approx(want, rel=1e-3), name


def test_an_unlooped_model_ignores_the_scale(tmp_path):
    cfg = tiny("baseline", loop_lr_scale=0.25, weight_decay=0.0)
    for name, move in first_step_moves(cfg, tmp_path).items():
        assert move == pytest.approx(LR, rel=1e-3), name


def test_scale_one_keeps_the_two_groups_old_states_were_saved_with(tmp_path):
    trainer = Trainer(tiny("smelt"), tmp_path / "r", progress=False)
    groups = trainer.optimizer.param_groups
    assert len(groups) == 2 and not any("lr_scale" in g for g in groups)
    assert [g["weight_decay"] > 0 for g in groups] == [True, False]


def test_a_resumed_scaled_run_is_bitwise_identical(tmp_path, monkeypatch):
    cfg = tiny("smelt", loop_lr_scale=0.5, steps=8, ckpt_every=4)
    full = Trainer(cfg, tmp_path / "full", progress=False)
    full.run()
    stop_after(monkeypatch, 6)
    with pytest.raises(KeyboardInterrupt):
        Trainer(cfg, tmp_path / "crash", progress=False).run()
    monkeypatch.undo()
    resumed = Trainer(cfg, tmp_path / "crash", resume=True, progress=False)
    resumed.run()
    assert [g.get("lr_scale") for g in resumed.optimizer.param_groups] == [None, None, 0.5, 0.5]
    want = full.model.state_dict()
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, want[name]), name


def test_the_pair_gives_the_scale_to_smelt_alone():
    base = tiny("baseline", loop_lr_scale=0.75)
    configs = pair_configs(base)
    scales = [configs[arch].optim.loop_lr_scale for arch in ("baseline", "smelt")]
    assert scales == [1.0, 0.75]
    # so the pair's Baseline runs of before the scale stay resumable and reusable
    assert configs["baseline"].same_run(pair_configs(tiny("baseline"))["baseline"])
    assert not configs["smelt"].same_run(pair_configs(tiny("baseline"))["smelt"])


@pytest.mark.parametrize("scale", [0.0, -0.5])
def test_a_scale_that_is_not_positive_is_refused(scale):
    with pytest.raises(ConfigError, match="loop_lr_scale"):
        tiny("smelt", loop_lr_scale=scale)
