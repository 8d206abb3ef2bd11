"""The trainer: WSD schedule values, decay branches, bitwise resume, atomic checkpoints under
SIGKILL, DDP under torchrun (gloo), learning a tiny Dyck task, and one-line errors."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from helpers.tiny_runs import TINY_MODEL, TINY_RUN
from helpers.torchrun import torchrun_train

from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.config import ModelConfig
from smelt_interp.errors import ConfigError, TrainingDiverged
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.schedule import WSDSchedule, branch_plan, decay_factor
from smelt_interp.train.trainer import Trainer


def tiny_cfg(**over) -> TrainConfig:
    base = {**TINY_RUN, "model": TINY_MODEL, "steps": 12, "ckpt_every": 4, "dyck_eval_n": 8}
    return TrainConfig.from_dict({**base, **over})


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "smelt_interp.train", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


# ----- configuration ------------------------------------------------------------------------
def test_config_holds_a_model_config_and_writes_plain_data():
    cfg = tiny_cfg(arch="smelt")
    assert isinstance(cfg.model, ModelConfig) and cfg.model.d_model == 32
    assert not cfg.model.is_looped and cfg.model.name == "baseline"
    data = cfg.to_dict()
    assert data["model"] == cfg.model.to_dict()
    assert json.loads(json.dumps(data)) == data  # checkpoints and JSON hold plain data
    assert TrainConfig.from_dict(data) == cfg
    assert cfg.with_overrides({"model.d_model": 64}).model.d_model == 64
    # max_seq_len, when a model dict leaves it out: 512, or seq_len when longer
    assert TrainConfig.from_dict({"model": {"d_model": 64}}).model.max_seq_len == 512
    assert TrainConfig.from_dict({"model": {}, "seq_len": 1024}).model.max_seq_len == 1024
    with pytest.raises(ConfigError, match="max_seq_len"):
        cfg.with_overrides({"seq_len": 256})  # longer than this model's context
    with pytest.raises(ConfigError, match="d_modle"):
        tiny_cfg(model={"d_modle": 3})
    with pytest.raises(ConfigError, match="unlooped"):
        TrainConfig(model=ModelConfig.smelt())


def test_validating_does_not_run_the_matcher_building_does(monkeypatch):
    import smelt_interp.budget as budget

    def refuse(*args, **kwargs):
        raise AssertionError("the budget matcher ran")

    monkeypatch.setattr(budget, "match_smelt", refuse)
    cfg = tiny_cfg(arch="smelt")
    cfg.with_overrides({"steps": 20})
    assert cfg.with_overrides({"arch": "baseline"}).model_config() == cfg.model
    with pytest.raises(AssertionError, match="matcher ran"):
        cfg.model_config()


# ----- schedule -----------------------------------------------------------------------------
def test_wsd_schedule_value_by_value():
    s = WSDSchedule(
        peak_lr=1.0, warmup_steps=2, horizon=10, decay_fraction=0.4, decay_shape="linear"
    )
    # warmup 2 steps, stable until step 6, 4 decay steps ending at 0
    assert [round(s(i), 6) for i in range(10)] == [
        0.5,
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
        0.75,
        0.5,
        0.25,
        0.0,
    ]
    cos = WSDSchedule(1.0, 0, 4, decay_fraction=0.5, decay_shape="cosine", min_lr_ratio=0.1)
    assert cos(0) == cos(1) == 1.0
    assert cos(2) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert cos(3) == pytest.approx(0.1)
    sq = WSDSchedule(2.0, 0, 8, decay_fraction=0.5, decay_shape="1-sqrt")
    assert [sq(i) for i in range(4, 8)] == pytest.approx(
        [2 * (1 - math.sqrt(k / 4)) for k in range(1, 5)]
    )


def test_decay_shapes_and_branch_plan():
    assert decay_factor(0.0, "1-sqrt") == 1.0 and decay_factor(1.0, "cosine") == pytest.approx(0.0)
    with pytest.raises(ConfigError, match="decay_shape"):
        decay_factor(0.5, "exp")
    # horizons 100, 40, 20 with 25% decay: branches leave the stable run at 15 and 30
    assert branch_plan([100, 40, 20], 0.25) == [(15, 20), (30, 40), (75, 100)]
    with pytest.raises(ConfigError, match="warmup_steps"):
        WSDSchedule(1.0, warmup_steps=9, horizon=10, decay_fraction=0.2)


def test_branches_follow_their_own_schedule(tmp_path):
    cfg = tiny_cfg(steps=12, branches=[8], decay_fraction=0.25, ckpt_every=100)
    result = Trainer(cfg, tmp_path / "run", progress=False).run()
    assert set(result.branches) == {8}
    _, branch = load_checkpoint(result.branches[8])
    assert branch.step == 8 and branch.meta["branch"] == 8
    assert load_checkpoint(result.checkpoint)[1].step == 12
    lrs = {}
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        rec = __import__("json").loads(line)
        if rec["event"] == "train":
            lrs.setdefault(rec.get("branch", "main"), {})[rec["step"]] = rec["lr"]
    branch_sched, main_sched = cfg.lr_schedule(8), cfg.lr_schedule(12)
    # the branch decays over steps 6..7; the main run stays stable there
    assert lrs[8] == {s + 1: pytest.approx(branch_sched(s)) for s in range(6, 8)}
    assert lrs["main"] == {s + 1: pytest.approx(main_sched(s)) for s in range(12)}
    assert lrs[8][8] < lrs["main"][8]


# ----- nothing lost -------------------------------------------------------------------------
def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_resume_is_bitwise_identical(tmp_path, monkeypatch):
    cfg = tiny_cfg(steps=12, branches=[8], decay_fraction=0.25, ckpt_every=3)
    full = Trainer(cfg, tmp_path / "full", progress=False)
    full.run()
    reference = _params(full.model)

    crashed = Trainer(cfg, tmp_path / "crash", progress=False)
    original = Trainer.train_step

    def dying_step(self, lr):
        if self.step == 10:
            raise KeyboardInterrupt("simulated kill")
        return original(self, lr)

    monkeypatch.setattr(Trainer, "train_step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        crashed.run()
    monkeypatch.setattr(Trainer, "train_step", original)
    resumed = Trainer(cfg, tmp_path / "crash", resume=True, progress=False)
    assert resumed.try_resume() and resumed.step == 9
    resumed = Trainer(cfg, tmp_path / "crash", resume=True, progress=False)
    resumed.run()
    got = _params(resumed.model)
    assert got.keys() == reference.keys()
    for name in reference:
        assert torch.equal(got[name], reference[name]), name
    # the branch checkpoint is identical too, and the metrics log has one record per step
    a = load_checkpoint(tmp_path / "full" / "branch-8" / "ckpt.pt")[0].state_dict()
    b = load_checkpoint(tmp_path / "crash" / "branch-8" / "ckpt.pt")[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [
        __import__("json").loads(l)["step"]
        for l in (tmp_path / "crash" / "metrics.jsonl").read_text().splitlines()
        if '"train"' in l and '"branch"' not in l
    ]
    assert steps == list(range(1, 13))


def test_resume_refuses_a_different_config(tmp_path):
    Trainer(tiny_cfg(steps=4), tmp_path / "r", progress=False).run()
    with pytest.raises(Exception, match="different training config"):
        Trainer(tiny_cfg(steps=6), tmp_path / "r", resume=True, progress=False).run()


def test_a_pair_rate_already_folded_into_lr_does_not_make_another_run(tmp_path):
    """arch_lr is spent once pair_configs has set each model's lr: a run saved under one
    arch_lr resumes under another, and only a change to what it trains with is refused."""
    saved = tiny_cfg(steps=4, arch_lr={"smelt": 5e-3})
    assert saved.same_run(tiny_cfg(steps=4)) and saved.same_run(tiny_cfg(steps=4, arch_lr={}))
    assert not saved.same_run(tiny_cfg(steps=4, lr=saved.optim.lr / 2))
    assert not saved.same_run(tiny_cfg(steps=4, seed=saved.seed + 1))
    run = tmp_path / "r"
    Trainer(tiny_cfg(steps=2, ckpt_every=2), run, progress=False).run()
    again = tiny_cfg(steps=2, ckpt_every=2, arch_lr={"smelt": 5e-3})
    Trainer(again, run, resume=True, progress=False).run()  # accepted, not refused
    records = (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())
    assert [r["step"] for r in records if r["event"] == "train"] == [1, 2]  # nothing retrained


SAVER = textwrap.dedent("""
    import sys, torch
    from smelt_interp import ModelConfig, SmeltModel
    from smelt_interp.checkpoint import save_checkpoint
    cfg = ModelConfig.baseline(d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, d_head=64,
                               n_experts=8, top_k=2, d_expert=256)
    model = SmeltModel(cfg)
    i = 0
    while True:
        save_checkpoint(sys.argv[1], model, round=i)
        print(i, flush=True)
        i += 1
""")


def test_kill_during_checkpoint_write_keeps_previous(tmp_path):
    path = tmp_path / "ckpt.pt"
    for delay in (0.05, 0.15, 0.3):
        proc = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(path)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout.readline().strip() == "0" or path.exists()  # first save finished
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        _, info = load_checkpoint(path)  # never a half-written file
        assert "round" in info.meta
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "ckpt.pt"]
    assert all(name.endswith(".tmp") for name in leftovers)


def test_nan_loss_stops_with_message_and_keeps_checkpoint(tmp_path, monkeypatch):
    cfg = tiny_cfg(steps=10, ckpt_every=2)
    trainer = Trainer(cfg, tmp_path / "nan", progress=False)
    import smelt_interp.train.step as step_mod

    real = step_mod.lm_loss

    def poisoned(logits, tokens):
        loss = real(logits, tokens)
        return loss * float("nan") if trainer.step >= 5 else loss

    monkeypatch.setattr(step_mod, "lm_loss", poisoned)
    with pytest.raises(TrainingDiverged, match="loss became nan at step 5.*last good checkpoint"):
        trainer.run()
    assert load_checkpoint(tmp_path / "nan" / "ckpt.pt")[1].step == 4


# ----- optimizer ---------------------------------------------------------------------------
def test_fused_adamw_equals_the_per_parameter_reference(tmp_path):
    """The trainer's fused AdamW against torch's reference per-parameter AdamW (foreach and
    fused off), same groups and seed: 10 steps of the tiny preset's SMELT give the same weights
    within float32 rounding. Measured max |diff| 1.2e-7 (weights up to ~1, matrices ~0.03-0.1);
    the fused kernel rounds its update differently (about 1 ulp a step), which the gradients
    then carry on. Changing beta2 by 1e-3 in the reference moves the weights by 4e-3."""
    from smelt_interp.train.optim import param_groups
    from smelt_interp.train.presets import get_preset

    cfg = TrainConfig.from_dict({**get_preset("dyck-pair-tiny"), "arch": "smelt"})
    fused = Trainer(cfg, tmp_path / "fused", progress=False)
    reference = Trainer(cfg, tmp_path / "reference", progress=False)
    assert all(g["fused"] for g in fused.optimizer.param_groups)
    reference.optimizer = torch.optim.AdamW(
        param_groups(reference.model, cfg),
        lr=cfg.optim.lr,
        betas=(cfg.optim.beta1, cfg.optim.beta2),
        fused=False,
        foreach=False,
    )
    for trainer in (fused, reference):
        for step in range(10):
            trainer.train_step(cfg.optim.lr * (step + 1) / 10)
    got, want = fused.model.state_dict(), reference.model.state_dict()
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    assert worst < 2e-6, worst
    # the weights did move (a test of two idle optimizers could not fail)
    start = Trainer(cfg, tmp_path / "start", progress=False).model.state_dict()
    assert max((want[k] - start[k]).abs().max().item() for k in want) > 1e-2


# ----- learning ------------------------------------------------------------------------------
def test_tiny_model_learns_tiny_dyck(tmp_path):
    cfg = tiny_cfg(
        steps=150,
        warmup_steps=10,
        lr=5e-3,
        batch_size=8,
        ckpt_every=1000,
        dyck_eval_n=64,
        eval_rows=4,
    )
    torch.manual_seed(0)
    result = Trainer(cfg, tmp_path / "learn", progress=False).run()
    assert result.final_eval["loss/dyck"] < 0.45
    assert result.final_eval["dyck_exact_match"] >= 0.8
    from smelt_interp.data.dyck import make_dataset
    from smelt_interp.measure.dyck_score import exact_match_accuracy

    model, _ = load_checkpoint(result.checkpoint)
    held = make_dataset(32, spec=cfg.corpus.dyck, split="heldout", seed=5)
    assert exact_match_accuracy(model, held) >= 0.75  # greedy decoding agrees


# ----- multi-process ----------------------------------------------------------------------
def test_torchrun_two_process_gloo(tmp_path):
    out = tmp_path / "ddp"
    stdout = torchrun_train(
        [
            "--preset",
            "dyck-pair-tiny",
            "--arch",
            "baseline",
            "--out",
            str(out),
            "--quiet",
            "--set",
            "steps=6",
            "--set",
            "warmup_steps=1",
            "--set",
            "eval_every=100",
            "--set",
            "ckpt_every=3",
            "--set",
            'data={"dyck": 1.0}',
            "--set",
            "threads=1",
        ]
    )
    assert stdout.count("baseline: ") == 1  # rank 0 reports; rank 1 stays quiet
    _, info = load_checkpoint(out / "baseline" / "ckpt.pt")
    assert info.step == 6
    assert info.meta["tokens"] == 6 * 2 * 8 * 128  # steps x ranks x batch x seq_len


# ----- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset", "nope"], "unknown preset 'nope'"),
        (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
        (["--data", "/no/such/path"], "/no/such/path"),
        (["--set", "steps=-3"], "steps must be a positive integer"),
        (["--set", "warp=9"], "unknown training field 'warp'"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, args, message):
    proc = run_cli(*args, "--out", str(tmp_path / "o"), timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "o").exists()


def test_bad_data_files_are_one_line_exit_2(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    binary = tmp_path / "latin1.txt"
    binary.write_bytes(b"caf\xe9 au lait\n")
    for path, message in ((empty, "empty"), (binary, "UTF-8")):
        proc = run_cli(
            "--preset",
            "dyck-pair-tiny",
            "--data",
            str(path),
            "--out",
            str(tmp_path / "o"),
            timeout=120,
        )
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0] and str(path) in lines[0], proc.stderr


def test_teacher_forced_exact_match_equals_greedy_decoding(tiny_pair):
    """The trainer's batched exact match agrees, example by example, with greedy generation."""
    from smelt_interp.data.dyck import DyckSpec, make_dataset
    from smelt_interp.measure.dyck_score import complete_many, teacher_forced_exact_match
    from smelt_interp.train.presets import get_preset

    spec = DyckSpec(**get_preset("dyck-pair-tiny")["dyck"])
    for path in tiny_pair.values():
        model, _ = load_checkpoint(path)
        examples = make_dataset(48, spec=spec, split="heldout", seed=3, n_demos=1)
        greedy = [
            answer == ex.answer for answer, ex in zip(complete_many(model, examples), examples)
        ]
        assert teacher_forced_exact_match(model, examples, batch_size=7) == greedy


def test_pair_configs_apply_per_architecture_learning_rates():
    from smelt_interp.train.presets import get_preset
    from smelt_interp.train.trainer import pair_configs

    base = TrainConfig.from_dict(
        {**get_preset("dyck-pair-tiny"), "lr": 2e-3, "arch_lr": {"smelt": 3e-3}}
    )
    configs = pair_configs(base)
    assert configs["baseline"].optim.lr == 2e-3 and configs["smelt"].optim.lr == 3e-3
    assert (configs["baseline"].arch, configs["smelt"].arch) == ("baseline", "smelt")
    with pytest.raises(ConfigError, match="arch_lr"):
        tiny_cfg(arch_lr={"dense": 1e-3})


def test_a_command_line_lr_applies_to_both_architectures(tmp_path, monkeypatch):
    from smelt_interp.train import presets
    from smelt_interp.train.build import build_config
    from smelt_interp.train.trainer import pair_configs

    rated = {**presets.PRESETS["dyck-pair-tiny"], "lr": 2e-3, "arch_lr": {"smelt": 3e-3}}
    monkeypatch.setitem(presets.PRESETS, "rated-pair", rated)  # a preset with a SMELT rate

    preset = build_config("rated-pair", None, [])
    rates = pair_configs(preset)
    assert rates["smelt"].optim.lr == 3e-3 and rates["baseline"].optim.lr == 2e-3
    plain = pair_configs(build_config("rated-pair", None, ["lr=1e-3"]))
    assert plain["smelt"].optim.lr == plain["baseline"].optim.lr == 1e-3
    both = pair_configs(build_config("rated-pair", None, ["lr=1e-3", "arch_lr.smelt=5e-3"]))
    assert (both["baseline"].optim.lr, both["smelt"].optim.lr) == (1e-3, 5e-3)
    cfg_file = tmp_path / "lr.json"
    cfg_file.write_text('{"lr": 4e-3, "steps": 500}')
    from_file = pair_configs(build_config("rated-pair", str(cfg_file), []))
    assert (
        from_file["smelt"].optim.lr == from_file["baseline"].optim.lr == 4e-3
        and from_file["smelt"].schedule.steps == 500
    )
