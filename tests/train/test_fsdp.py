"""FSDP2 (`parallel=fsdp`) with 2 gloo processes on CPU, against one process: the same losses,
weights and evaluation as single-process training on the same global batch, a gathered checkpoint
that one process loads with the sharded model's logits, and a SIGKILLed run that resumes to the
uninterrupted run's weights. Both architectures; SMELT visits its looped Blocks (FSDP units)
more than once per forward pass."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from helpers.tiny_runs import TINY_RUN
from helpers.torchrun import REPO, torchrun_command, torchrun_env, torchrun_run

from smelt_interp.checkpoint import load_checkpoint, read_info
from smelt_interp.errors import ConfigError
from smelt_interp.provenance import CKPT_FILE, METRICS_FILE
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.data import TrainingData
from smelt_interp.train.presets import PRESETS
from smelt_interp.train.trainer import STATE_FILE, Trainer

WORKER = str(REPO / "tests" / "helpers" / "fsdp_worker.py")
WORLD = 2
CONFIG = {
    **TINY_RUN,
    "model": {**PRESETS["dyck-pair-tiny"]["model"], "max_seq_len": 128},
    "steps": 6,
    "branches": [4],  # a decay branch: snapshot and restore of the sharded state
    "ckpt_every": 2,
    "dyck_eval_n": 4,
    "threads": 1,
    "parallel": "fsdp",
}
ARCHS = ("baseline", "smelt")
LOSS_TOL = 1e-5  # float32 sums in a different order (reduce-scatter vs accumulation)
WEIGHT_TOL = 1e-5
LOGIT_TOL = 1e-5


def worker(out: Path, *flags: str) -> list[str]:
    return [WORKER, str(out), json.dumps(CONFIG), *flags]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """Both architectures trained under FSDP by one torchrun launch (one process group), with
    the sharded models' logits saved."""
    out = tmp_path_factory.mktemp("fsdp")
    torchrun_run(worker(out, "--archs", ",".join(ARCHS), "--logits"), nproc=WORLD)
    return out


def one_process_reference(arch: str, out: Path) -> Trainer:
    """One process on the same global batch: rank r's batch of each step as micro-batch r of
    a grad_accum=2 step (so the MoE auxiliary losses, too, are per rank's batch, as under
    FSDP and DDP)."""
    cfg = TrainConfig.from_dict(CONFIG).with_overrides({"arch": arch})
    trainer = Trainer(cfg.with_overrides({"grad_accum": WORLD}), out, progress=False)
    ranks = [TrainingData(cfg, rank=r) for r in range(WORLD)]
    trainer.data.batch_at = lambda step, micro=0: ranks[micro].batch_at(step, 0)
    trainer.run()
    return trainer


def train_records(folder: Path) -> list[dict]:
    lines = (folder / METRICS_FILE).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "train"]


def assert_weights_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= WEIGHT_TOL, worst
    return worst


@pytest.mark.parametrize("arch", ARCHS)
def test_fsdp_equals_one_process_on_the_global_batch(arch, sharded, tmp_path):
    ref = one_process_reference(arch, tmp_path / arch)
    got, want = train_records(sharded / arch), train_records(tmp_path / arch)
    assert [(r["step"], r.get("branch")) for r in got] == [
        (r["step"], r.get("branch")) for r in want
    ]
    for g, w in zip(got, want, strict=True):
        assert abs(g["loss"] - w["loss"]) <= LOSS_TOL, (g, w)
        assert abs(g["grad_norm"] - w["grad_norm"]) <= 1e-4 * w["grad_norm"], (g, w)
    model, info = load_checkpoint(sharded / arch / CKPT_FILE)
    assert info.step == CONFIG["steps"] and info.final
    assert info.meta["tokens"] == CONFIG["steps"] * WORLD * CONFIG["batch_size"] * 64
    assert_weights_close(model.state_dict(), ref.model.state_dict())
    # the evaluation ran on the sharded model (on every rank) and measured the same model
    for key, value in ref.evaluate(greedy=True).items():
        assert info.eval[key] == pytest.approx(value, abs=1e-4), key
    branch, _ = load_checkpoint(sharded / arch / "branch-4" / CKPT_FILE)
    ref_branch, _ = load_checkpoint(tmp_path / arch / "branch-4" / CKPT_FILE)
    assert_weights_close(branch.state_dict(), ref_branch.state_dict())


@pytest.mark.parametrize("arch", ARCHS)
def test_gathered_checkpoint_loads_in_one_process_with_the_sharded_logits(arch, sharded):
    saved = torch.load(sharded / arch / "logits.pt", weights_only=True)
    assert saved["tokens"].shape[0] == 2 * WORLD  # rows from both ranks
    assert saved["local_numel"] < 0.6 * saved["full_numel"]  # each rank held about half
    model, _ = load_checkpoint(sharded / arch / CKPT_FILE)  # torch.load(weights_only=True)
    with torch.no_grad():
        logits = model(saved["tokens"]).float()
    worst = float((logits - saved["logits"]).abs().max())
    assert worst <= LOGIT_TOL, worst


def test_sigkilled_fsdp_run_resumes_to_the_uninterrupted_weights(sharded, tmp_path):
    """Every rank SIGKILLs itself about to train step 5; the state saved at step 4 resumes."""
    out = tmp_path / "killed"
    for _ in range(2):  # a second try only if the first never got going (rendezvous)
        proc = subprocess.run(
            torchrun_command(worker(out, "--archs", "smelt", "--kill-at", "5"), nproc=WORLD),
            capture_output=True,
            text=True,
            timeout=300,
            env=torchrun_env(),
        )
        assert proc.returncode != 0
        if (out / "smelt" / STATE_FILE).exists():
            break
    assert torch.load(out / "smelt" / STATE_FILE, weights_only=True)["step"] == 4
    info = read_info(out / "smelt" / CKPT_FILE)
    assert info.step == 4 and not info.final
    torchrun_run(worker(out, "--archs", "smelt", "--resume"), nproc=WORLD)
    resumed, info = load_checkpoint(out / "smelt" / CKPT_FILE)
    uninterrupted, _ = load_checkpoint(sharded / "smelt" / CKPT_FILE)
    assert info.step == CONFIG["steps"] and info.final
    a, b = resumed.state_dict(), uninterrupted.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [r["step"] for r in train_records(out / "smelt") if "branch" not in r]
    assert steps == list(range(1, CONFIG["steps"] + 1))


def test_parallel_mode_is_checked():
    with pytest.raises(ConfigError, match="parallel must be one of ddp, fsdp, got 'zero3'"):
        TrainConfig.from_dict({**CONFIG, "parallel": "zero3"})


def test_fsdp_on_cuda_gathers_bf16_and_reduces_float32(monkeypatch):
    """shard_model hands every unit (each Block, then the root) the mixed-precision policy: on
    CUDA bf16 parameters for the all-gather and the compute, float32 for the gradient
    reduction; on CPU float32 throughout (as the gloo tests above run)."""
    from smelt_interp.model.transformer import SmeltModel
    from smelt_interp.train import parallel

    calls = []
    monkeypatch.setattr(parallel, "init_device_mesh", lambda *a, **k: "mesh")
    monkeypatch.setattr(parallel.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(parallel, "fully_shard", lambda module, **kw: calls.append((module, kw)))
    model = SmeltModel(TrainConfig.from_dict(CONFIG).model_config())
    parallel.shard_model(model, torch.device("cuda", 0))
    assert [m for m, _ in calls] == [*model.blocks, model]
    for _, kw in calls:
        policy = kw["mp_policy"]
        assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    cpu = parallel.mixed_precision(torch.device("cpu"))
    assert cpu.param_dtype is None and cpu.reduce_dtype is None
