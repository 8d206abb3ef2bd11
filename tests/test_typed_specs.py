"""A run's Dyck and trigger data are typed specs (`TrainConfig.dyck: DyckSpec`, `.trigger:
TriggerSpec`) that validate themselves from their fields' ranges: every field a config accepts
reaches the generator (`--set dyck.p_open=0.3` changes the rows), a bad value is one line from
every command that reads it (training, `train ladder`, `train eval`, the probes, the report),
and checkpoints that store the specs as plain mappings still load."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TINY_FIELDS
from helpers.bad_input import assert_one_line_error, run_command

from smelt_interp.checkpoint import load_checkpoint, save_checkpoint
from smelt_interp.commands.dyck_seed_tables import heldout_words
from smelt_interp.config import ModelConfig
from smelt_interp.data.dyck import DyckSpec, make_dataset, nesting_depth, packed_rows
from smelt_interp.data.trigger import TriggerSpec
from smelt_interp.errors import ConfigError
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.provenance import Provenance
from smelt_interp.train.assess import assess
from smelt_interp.train.config import TrainConfig, apply_overrides
from smelt_interp.train.data import TrainingData
from smelt_interp.train.evaluate import heldout_dyck_examples
from smelt_interp.train.ladder import CPU_LADDER
from smelt_interp.train.presets import get_preset

TINY = get_preset("dyck-pair-tiny")
PROBES = ("sink", "routing", "similarity", "residual", "case_study", "lens", "dla")
# train_config as checkpoints stored it when `dyck` and `trigger` were plain dicts: the Dyck
# spec without p_open, the trigger spec empty or with `kinds` as a list.
OLD_SHAPE: dict[str, Any] = {
    **TrainConfig.from_dict({**TINY, "data": {"dyck": 1.0}}).to_dict(),
    "dyck": {"n_pairs": 2, "max_depth": 3, "min_len": 2, "max_len": 8},
    "trigger": {},
}


def write_checkpoint(path: Path, train_config: Any) -> Path:
    torch.manual_seed(0)
    model = SmeltModel(ModelConfig.baseline(**{**TINY_FIELDS, "max_seq_len": 128}))
    return save_checkpoint(path, model, step=0, train_config=train_config)


def test_p_open_reaches_the_rows_a_run_trains_on():
    base = TrainConfig.from_dict(TINY)
    for spelling in ({"dyck.p_open": 0.3}, {"dyck": {**TINY["dyck"], "p_open": 0.3}}):
        cfg = base.with_overrides({**spelling, "data": {"dyck": 1.0}})
        assert cfg.corpus.dyck == DyckSpec(**TINY["dyck"], p_open=0.3)
        rows = TrainingData(cfg).batch_at(0)
        seed = f"{cfg.seed}:0:0:dyck0"  # TrainingData's seed of step 0's Dyck rows
        want = packed_rows(cfg.batch.size, cfg.batch.seq_len, seed, spec=cfg.corpus.dyck)
        assert torch.equal(rows, want)
        same_seed_half = packed_rows(cfg.batch.size, cfg.batch.seq_len, seed, spec=base.corpus.dyck)
        assert not torch.equal(rows, same_seed_half)


def test_p_open_changes_the_words_as_a_random_walk_would():
    """Fewer openings: prefixes nest less deep on average (reference: the walk's definition)."""
    depth = {
        p: statistics.mean(
            nesting_depth(ex.query)
            for ex in make_dataset(400, spec=DyckSpec(max_depth=30, max_len=40, p_open=p))
        )
        for p in (0.3, 0.5, 0.7)
    }
    assert depth[0.3] < depth[0.5] < depth[0.7]


def test_held_out_words_are_the_task_draw_whatever_the_training_bias():
    """A run trained on deeper words (p_open 0.7) is scored, by the trainer, `train eval` and the
    seeds command alike, on the words an unbiased run is: the task's draw, not its own."""
    spec = DyckSpec(max_depth=30, max_len=40)
    biased = DyckSpec(max_depth=30, max_len=40, p_open=0.7)
    assert biased.task_draw() == spec and spec.task_draw() == spec
    assert heldout_words(50, biased) == heldout_words(50, spec)
    base = TrainConfig.from_dict({**TINY, "data": {"dyck": 1.0}})
    deep = base.with_overrides({"dyck.p_open": 0.7})
    assert heldout_dyck_examples(deep, 40, seed=3) == heldout_dyck_examples(base, 40, seed=3)
    assert torch.equal(TrainingData(deep).heldout("dyck", 4), TrainingData(base).heldout("dyck", 4))
    assert not torch.equal(TrainingData(deep).batch_at(0), TrainingData(base).batch_at(0))


def test_training_with_p_open_runs_from_the_command_line(tmp_path: Path):
    """Fails on a TrainConfig whose dyck is a dict passed to packed_rows(**dyck)."""
    code, _, err = run_command(
        "smelt_interp.train",
        *("--preset", "dyck-pair-tiny", "--arch", "baseline", "--out", tmp_path, "--quiet"),
        *("--set", "steps=2", "--set", "threads=1", "--set", "dyck_eval_n=4"),
        *("--set", "eval_every=1000", "--set", "dyck.p_open=0.3"),
    )
    assert code == 0, err
    _, info = load_checkpoint(tmp_path / "baseline" / "ckpt.pt")
    assert info.train_config["dyck"]["p_open"] == 0.3
    assert Provenance.of(info).dyck_spec.p_open == 0.3


def test_the_ladder_takes_spec_overrides_and_refuses_bad_ones_in_one_line(tmp_path: Path):
    cfg = TrainConfig.from_dict(apply_overrides(CPU_LADDER, {"dyck.p_open": 0.3}))
    assert cfg.corpus.dyck == DyckSpec(p_open=0.3) and cfg.schedule.steps == CPU_LADDER["steps"]
    for item, needle in (("dyck.p_open=2", "p_open"), ("dyck.bogus=1", "bogus")):
        code, _, err = run_command(
            "smelt_interp.train", "ladder", "--sizes", "1", "--out", tmp_path, "--set", item
        )
        assert_one_line_error(code, err, needle)


@pytest.mark.parametrize(
    "override, needle",
    [
        ({"dyck.p_open": 1.5}, "p_open"),
        ({"dyck.p_open": "x"}, "p_open"),
        ({"dyck.max_len": 1}, "max_len"),
        ({"dyck.n_pairs": 9}, "n_pairs"),
        ({"dyck": [1, 2]}, "dyck"),
        ({"dyck.bogus": 1}, "bogus"),
        ({"trigger.rate": 0.7}, "rate"),
        ({"trigger.kinds": ["nope"]}, "kinds"),
        ({"trigger.kinds": [[1]]}, "kinds"),
        ({"trigger.filler": "zipf"}, "filler"),
        ({"trigger": "x"}, "trigger"),
    ],
)
def test_bad_spec_values_are_one_line_config_errors(override, needle):
    with pytest.raises(ConfigError, match=needle) as info:
        TrainConfig.from_dict(TINY).with_overrides(override)
    assert "\n" not in str(info.value)


def test_a_checkpoint_written_with_the_old_dict_shape_still_loads(tmp_path: Path):
    cfg = TrainConfig.from_dict(OLD_SHAPE)
    assert cfg.corpus.dyck == DyckSpec(n_pairs=2, max_depth=3, min_len=2, max_len=8, p_open=0.5)
    assert cfg.corpus.trigger == TriggerSpec()
    old = {**OLD_SHAPE, "trigger": {"rate": 0.2, "kinds": ["backcopy", "recall"]}}
    want = TriggerSpec(rate=0.2, kinds=("backcopy", "recall"))
    assert TrainConfig.from_dict(old).corpus.trigger == want
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg  # and the new shape round-trips
    path = write_checkpoint(tmp_path / "old.pt", OLD_SHAPE)
    _, info = load_checkpoint(path)
    assert Provenance.of(info).dyck_spec == cfg.corpus.dyck
    report = assess(path, n_examples=4, loss_rows=1)
    assert report["dyck_n"] == 4 and report["dyck_max_depth"] == 3
    code, out, err = run_command("smelt_interp.train", "eval", path, "--n", "2", "--loss-rows", "1")
    assert code == 0, err


def test_train_eval_draws_the_task_words_of_the_spec_a_checkpoint_was_trained_with(tmp_path: Path):
    """Fails where the checkpoint's dyck mapping is passed to make_dataset(**dyck): its limits
    reach the held-out words, and its training bias (p_open 0.3) is reset to the task's draw."""
    spec = {**OLD_SHAPE["dyck"], "max_depth": 4, "p_open": 0.3}
    path = write_checkpoint(tmp_path / "p.pt", {**OLD_SHAPE, "dyck": spec, "seed": 3})
    report = assess(path, n_examples=8, loss_rows=1, seed=5)
    assert report["dyck_n"] == 8 and report["dyck_seed"] == 5 and report["dyck_max_depth"] == 4
    _, info = load_checkpoint(path)
    drawn = heldout_dyck_examples(TrainConfig.from_dict(info.train_config), 8, seed=5)
    task = DyckSpec(**{**spec, "p_open": 0.5})
    assert drawn == make_dataset(8, spec=task, split="heldout", seed=5)
    assert drawn != make_dataset(8, spec=DyckSpec(**spec), split="heldout", seed=5)
    assert drawn != make_dataset(8, spec=DyckSpec(**OLD_SHAPE["dyck"]), split="heldout", seed=5)
    code, out, err = run_command("smelt_interp.train", "eval", path, "--n", "2", "--loss-rows", "1")
    assert code == 0, err


BAD_DYCKS = [{"bogus": 1}, {"n_pairs": "x"}, [1, 2]]


@pytest.mark.parametrize("dyck", BAD_DYCKS, ids=["unknown-field", "text-count", "list"])
def test_a_checkpoint_with_a_bad_dyck_spec_is_one_line_from_every_command(tmp_path: Path, dyck):
    path = write_checkpoint(tmp_path / "bad.pt", {**OLD_SHAPE, "dyck": dyck})
    commands = [(f"smelt_interp.probes.{name}", path) for name in PROBES]
    commands += [("smelt_interp.report", path, "--json", tmp_path / "r.json")]
    commands += [("smelt_interp.train", "eval", path, "--n", "2")]
    for module, *args in commands:
        code, _, err = run_command(module, *args)
        assert_one_line_error(code, err, "dyck")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("steps", [4, 5, 8, 12])
def test_a_short_run_cuts_its_warmup_to_the_stable_phase(steps: int):
    """The tiny preset warms up for 10 steps; a 4..12-step run warms up until its decay."""
    cfg = TrainConfig.from_dict(TINY).with_overrides({"steps": steps})
    schedule = cfg.lr_schedule(steps)
    decay_start = steps - round(TINY["decay_fraction"] * steps)
    assert schedule.warmup_steps == min(TINY["warmup_steps"], decay_start)
    lrs = [schedule(s) for s in range(steps)]
    assert max(lrs) == pytest.approx(cfg.optim.lr)  # reaches the peak, then decays to the floor
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)


def test_a_short_run_trains_from_the_command_line(tmp_path: Path):
    code, _, err = run_command(
        "smelt_interp.train",
        *("--preset", "dyck-pair-tiny", "--arch", "baseline", "--out", tmp_path, "--quiet"),
        *("--set", "steps=4", "--set", "threads=1", "--set", "dyck_eval_n=2"),
        *("--set", "eval_every=1000"),
    )
    assert code == 0, err


def train_tiny(out: Path, *sets: str) -> tuple[int, str]:
    """`python -m smelt_interp.train` on the tiny preset, Baseline only: (exit code, stderr)."""
    args: list[Any] = ["--preset", "dyck-pair-tiny", "--arch", "baseline", "--out", out, "--quiet"]
    for item in ("steps=2", "threads=1", *sets):
        args += ["--set", item]
    code, _, err = run_command("smelt_interp.train", *args)
    return code, err


@pytest.mark.parametrize("domain", ["text", "mine"])
def test_a_domain_of_user_files_without_data_paths_is_one_line(tmp_path: Path, domain: str):
    code, err = train_tiny(tmp_path, f'data={{"dyck":0.5,"{domain}":0.5}}')
    assert_one_line_error(code, err, domain, "data_paths")


HUGE = "k" * 2_000_000


@pytest.mark.parametrize(
    "item", [f"{HUGE}=1", f"dyck.{HUGE}=1", f'data={{"{HUGE}":1}}', f'row_len={{"{HUGE}":8}}']
)
def test_a_huge_name_is_cut_in_the_error_line(tmp_path: Path, item: str):
    code, err = train_tiny(tmp_path, item)
    assert_one_line_error(code, err)
    assert len(err) < 400
