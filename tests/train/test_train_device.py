"""The training step as a GPU runs it, checked on the CPU: no value read back to the host within
a step (every read counted), the metrics of a window of steps read in one go with a non-finite
one found at its step, batches built ahead in a thread with their ids checked on the CPU tensor,
and a resume whose state would otherwise land on a non-CPU device."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from helpers.tiny_runs import TINY_RUN

from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.errors import TokenError, TrainingDiverged
from smelt_interp.model.protocol import autocast_for
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.prefetch import BatchPrefetcher
from smelt_interp.train.presets import get_preset
from smelt_interp.train.state import restore_rng, rng_state
from smelt_interp.train.step import MetricWindow, StepResult
from smelt_interp.train.trainer import STATE_FILE, Trainer

MODEL = {**get_preset("dyck-pair-tiny")["model"], "max_seq_len": 64}  # SMELT matches it
# What reads a tensor's value back to the host (on CUDA each waits for the queued kernels).
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


def _cfg(**over) -> TrainConfig:
    return TrainConfig.from_dict({**TINY_RUN, "model": MODEL, "steps": 12, "threads": 1, **over})


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """Every host read of a tensor's value made on this thread (the batch thread's CPU-side
    checks are not reads from the device), by method name."""
    seen: list[str] = []
    main = threading.get_ident()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            if threading.get_ident() == main:
                seen.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return seen


@pytest.mark.parametrize("arch", ["baseline", "smelt"])
@pytest.mark.parametrize("row_len", [{}, {"dyck": 32}])
def test_a_training_step_reads_nothing_back(tmp_path: Path, reads, arch, row_len) -> None:
    """A step (forward per row length, backward, clip, AdamW) makes no host read: its metrics
    stay on the device. Reading them is one `tolist` for a whole window of steps."""
    over = {"row_len": row_len, "data": {"dyck": 0.5, "trigger": 0.5}} if row_len else {}
    trainer = Trainer(_cfg(arch=arch, **over), tmp_path, progress=False)
    trainer.window.add(1, trainer.train_step(1e-3))  # the first step sets up AdamW's state
    reads.clear()
    for _ in range(3):
        trainer.window.add(trainer.step + 1, trainer.train_step(1e-3))
    assert reads == []
    records = trainer.window.read()
    assert reads == ["tolist"]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["loss"] > 0 and r["grad_norm"] > 0 for r in records)
    trainer.batches.close()


def test_step_result_reads_on_demand() -> None:
    result = StepResult(torch.tensor([2.5, 1.0, 0.25, 3.0]), lr=1e-3)
    assert dict(result) == {
        "loss": 2.5, "load_balance": 1.0, "z_loss": 0.25, "grad_norm": 3.0, "lr": 1e-3
    }  # fmt: skip


def test_window_stops_at_the_first_non_finite_step() -> None:
    window = MetricWindow(lambda: "nothing was saved")
    for step, (loss, norm) in enumerate([(2.0, 1.0), (1.9, float("inf")), (float("nan"), 1.0)]):
        window.add(step + 1, StepResult(torch.tensor([loss, 1.0, 0.1, norm]), lr=0.1))
    with pytest.raises(TrainingDiverged, match=r"gradient norm became inf .*at step 1 "):
        window.read()
    assert len(window) == 0


def test_batches_are_built_ahead_in_a_thread_and_equal_the_data(tmp_path: Path) -> None:
    trainer = Trainer(_cfg(grad_accum=2), tmp_path, progress=False)
    batches = trainer.batches
    builders: list[str] = []
    original = batches.build
    batches.build = lambda *key: builders.append(threading.current_thread().name) or original(*key)
    for step, micro in [(0, 0), (0, 1), (1, 0), (5, 1), (1, 1)]:  # (5, 1): out of order
        got = batches.get(step, micro)
        want = trainer.data.batch_parts(step, micro)
        assert len(got) == len(want) == 1
        assert torch.equal(got[0][0], want[0])
        assert got[0][1] == int((want[0][:, 1:] != PAD_ID).sum()) > 0
    assert not got[0][0].is_pinned()  # pinned only for a CUDA device
    assert any(name.startswith("smelt-batches") for name in builders)
    batches.close()


def test_token_ids_are_checked_on_the_cpu_batch(tmp_path: Path, monkeypatch) -> None:
    trainer = Trainer(_cfg(), tmp_path, progress=False)
    bad = torch.full((2, 8), 300)
    monkeypatch.setattr(trainer.data, "batch_parts", lambda step, micro: [bad])
    prefetch = BatchPrefetcher(trainer.data, 1, trainer.model_cfg.vocab_size, trainer.device)
    top = trainer.model_cfg.vocab_size - 1
    with pytest.raises(TokenError, match=rf"0\.\.{top}, got 300\.\.300"):
        prefetch.get(0, 0)
    prefetch.close()


def test_resume_restores_the_generators_whatever_the_device(tmp_path: Path) -> None:
    """A Trainer whose device is not the CPU (here `meta`, the only other device this machine
    has) resumes: the state is read onto the CPU, so the CPU generator's ByteTensor reaches
    torch.set_rng_state as one, and load_state_dict copies the weights to wherever the model
    lives. Read onto the device instead, a resume is reported as a damaged
    state: here at copying the weights off `meta`, on CUDA at torch.set_rng_state's TypeError."""
    cfg = _cfg(steps=2, ckpt_every=1)
    Trainer(cfg, tmp_path, progress=False).run()
    saved = torch.load(tmp_path / STATE_FILE, weights_only=True)
    torch.manual_seed(123)  # a generator state other than the saved one
    resumed = Trainer(cfg, tmp_path, resume=True, progress=False)
    resumed.device = torch.device("meta")
    assert resumed.try_resume() and resumed.step == 2
    assert torch.equal(torch.get_rng_state(), saved["rng"]["cpu"])
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, saved["model"][name]), name


def test_rng_state_round_trip_from_a_non_cpu_mapping() -> None:
    """restore_rng takes the saved states wherever torch.load put them: a copy on another
    dtype/device view is moved back to a CPU ByteTensor before torch.set_rng_state sees it."""
    state = rng_state(torch.device("cpu"))
    first = torch.rand(3)
    torch.manual_seed(7)
    restore_rng({"cpu": state["cpu"].to(torch.int16)}, torch.device("cpu"))  # not a ByteTensor
    assert torch.equal(torch.rand(3), first)
    restore_rng(state["cpu"], torch.device("cpu"))  # a bare tensor is the CPU state alone
    assert torch.equal(torch.rand(3), first)


@pytest.mark.filterwarnings("ignore:User provided device_type of 'cuda'")
def test_probes_run_under_bf16_autocast_on_cuda_only() -> None:
    """The model's autocast (training, measure.batching.capture and the sink probe's BOS column)
    is bf16 on CUDA, where the grouped expert kernels take only bf16; on the CPU it leaves
    float32 alone."""
    cuda = autocast_for(torch.device("cuda"))
    assert (cuda.device, cuda.fast_dtype) == ("cuda", torch.bfloat16)
    assert not autocast_for(torch.device("cpu"))._enabled
