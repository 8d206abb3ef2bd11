"""The weights' moving average (TrainConfig.ema_decay): ckpt.pt holds the average of the
trained weights, checked against a float64 loop over the weights of every step; the trained
weights themselves are those of a run without it, bit for bit; resume and decay branches carry
the average exactly; evaluation scores the average."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_runs import TINY_MODEL, TINY_RUN
from test_kept_checkpoints import stop_after

from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.errors import ConfigError
from smelt_interp.provenance import CKPT_FILE
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.evaluate import heldout_loss
from smelt_interp.train.run_folder import STATE_FILE, kept_checkpoints
from smelt_interp.train.trainer import Trainer

DECAY = 0.8  # a short window, so that every step's weights weigh in the average


def cfg(**over) -> TrainConfig:
    base = {**TINY_RUN, "model": TINY_MODEL, "steps": 10, "ckpt_every": 3, "dyck_eval_n": 0}
    return TrainConfig.from_dict({**base, **over})


def weights(path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)[0].state_dict()


def trained(path) -> dict[str, torch.Tensor]:
    return torch.load(path / STATE_FILE, weights_only=True)["model"]


def test_the_checkpoint_is_the_moving_average_of_every_steps_weights(tmp_path):
    # Without the average, a checkpoint kept at every step records the trained weights' path.
    Trainer(cfg(ckpt_every=1, keep_ckpts_until=10), tmp_path / "plain", progress=False).run()
    path = [weights(p) for _, p in sorted(kept_checkpoints(tmp_path / "plain").items())]
    path.append(weights(tmp_path / "plain" / CKPT_FILE))
    assert len(path) == 10

    Trainer(cfg(ema_decay=DECAY), tmp_path / "ema", progress=False).run()
    assert all(
        torch.equal(a, b) for a, b in zip(trained(tmp_path / "ema").values(), path[-1].values())
    )

    got = weights(tmp_path / "ema" / CKPT_FILE)
    for name, value in got.items():
        expected = path[0][name].double()  # the first update copies the weights
        for step_weights in path[1:]:
            expected = DECAY * expected + (1 - DECAY) * step_weights[name].double()
        torch.testing.assert_close(value.double(), expected, rtol=0, atol=1e-6, msg=name)
        if "ln" not in name:  # norms may not move in 10 steps; every matrix does
            assert not torch.equal(value, path[-1][name]), name


def test_resume_and_branches_carry_the_average_bit_for_bit(tmp_path, monkeypatch):
    run = cfg(ema_decay=DECAY, steps=12, branches=[8], decay_fraction=0.25)
    Trainer(run, tmp_path / "full", progress=False).run()

    stop_after(monkeypatch, 10)
    with pytest.raises(KeyboardInterrupt):
        Trainer(run, tmp_path / "crash", progress=False).run()
    monkeypatch.undo()
    Trainer(run, tmp_path / "crash", resume=True, progress=False).run()

    for rel in (CKPT_FILE, f"branch-8/{CKPT_FILE}"):
        a, b = weights(tmp_path / "full" / rel), weights(tmp_path / "crash" / rel)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), rel
    a, b = trained(tmp_path / "full"), trained(tmp_path / "crash")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_evaluation_scores_the_average_not_the_trained_weights(tmp_path):
    trainer = Trainer(cfg(ema_decay=DECAY), tmp_path / "ema", progress=False)
    trainer.run()
    rows = trainer.data.heldout("dyck", trainer.cfg.eval.rows)
    saved = load_checkpoint(tmp_path / "ema" / CKPT_FILE)[0].eval()
    assert trainer.evaluate()["loss/dyck"] == pytest.approx(heldout_loss(saved, rows), abs=1e-6)
    assert heldout_loss(saved, rows) != pytest.approx(heldout_loss(trainer.model, rows), abs=1e-6)


@pytest.mark.parametrize("decay", [1.0, -0.1, 1.5])
def test_a_decay_outside_zero_to_one_is_refused(decay):
    with pytest.raises(ConfigError, match="ema_decay"):
        cfg(ema_decay=decay)
