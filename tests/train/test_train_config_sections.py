"""TrainConfig in sections: records saved while it was flat still load and are written back as
they were, every flat spelling (a record's key, a preset's, `--set lr=...`) reaches the same
field as its sectioned path, and a key that names nothing is one line naming the right path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smelt_interp.errors import ConfigError
from smelt_interp.train.build import build_config
from smelt_interp.train.config import FLAT_PATHS, LATER_SPECS, RENAMED, SECTIONS, TrainConfig
from smelt_interp.train.presets import PRESETS, get_preset
from smelt_interp.train.trainer import pair_configs

# Records as TrainConfig.to_dict wrote them while it was one flat dataclass (tests/data/README.md).
TESTS = Path(__file__).resolve().parents[1]
FLAT_RECORDS = json.loads((TESTS / "data" / "flat_train_configs.json").read_text(encoding="utf-8"))

# Where each flat key of a record lives now, written out by hand (not derived from the code).
WHERE = {
    "data": "corpus.weights",
    "dyck": "corpus.dyck",
    "data_paths": "corpus.paths",
    "trigger": "corpus.trigger",
    "assoc_recall": "corpus.assoc_recall",
    "computed_recall": "corpus.computed_recall",
    "row_len": "batch.row_len",
    "doc_rows": "batch.doc_rows",
    "dyck_packing": "batch.dyck_packing",
    "seq_len": "batch.seq_len",
    "batch_size": "batch.size",
    "grad_accum": "batch.grad_accum",
    "lr": "optim.lr",
    "arch_lr": "optim.arch_lr",
    "loop_lr_scale": "optim.loop_lr_scale",
    "weight_decay": "optim.weight_decay",
    "beta1": "optim.beta1",
    "beta2": "optim.beta2",
    "grad_clip": "optim.grad_clip",
    "ema_decay": "optim.ema_decay",
    "load_balance_coef": "optim.load_balance_coef",
    "z_loss_coef": "optim.z_loss_coef",
    "min_lr_ratio": "schedule.min_lr_ratio",
    "warmup_steps": "schedule.warmup_steps",
    "steps": "schedule.steps",
    "branches": "schedule.branches",
    "decay_fraction": "schedule.decay_fraction",
    "decay_shape": "schedule.decay_shape",
    "eval_every": "eval.every",
    "eval_rows": "eval.rows",
    "dyck_eval_n": "eval.dyck_n",
    "dyck_eval_demos": "eval.dyck_demos",
    "ckpt_every": "checkpoint.every",
    "keep_ckpts_until": "checkpoint.keep_until",
    "device": "runtime.device",
    "compile": "runtime.compile",
    "parallel": "runtime.parallel",
    "threads": "runtime.threads",
    "model": "model",
    "arch": "arch",
    "seed": "seed",
    "d_head_multiple": "d_head_multiple",
    "shards": "corpus.shards",
}
# Fields added after the flat records were captured, written back at their defaults (a record
# without them loads with those defaults, so an old run resumes as the same run).
ADDED = {"shards": ""}
ADDED_MODEL = {"positions": "rope", "norm": "rms", "hidden_key_ids": [], "hide_keys_from": 1}
ADDED_ASSOC_RECALL = {"trigger_pool": 0}


def value_at(cfg: TrainConfig, path: str):
    value = cfg
    for part in path.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("name", sorted(FLAT_RECORDS))
def test_a_flat_record_loads_and_is_written_back_as_it_was(name: str) -> None:
    record = FLAT_RECORDS[name]
    cfg = TrainConfig.from_dict(record)
    expected = {
        **record,
        **ADDED,
        "model": {**record["model"], **ADDED_MODEL},
        "assoc_recall": {**record["assoc_recall"], **ADDED_ASSOC_RECALL},
    }
    assert cfg.to_dict() == expected  # so a state.pt of the flat code is the same run (same_run)
    assert json.dumps(cfg.to_dict(), sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert set(record) | set(ADDED) | set(LATER_SPECS) == set(WHERE)
    for key, path in WHERE.items():
        value = value_at(cfg, path)
        if key == "model":
            assert value.to_dict() == expected["model"]
        elif key in ("dyck", "trigger", "assoc_recall"):
            assert type(value).from_mapping(record[key]) == value
        elif key in LATER_SPECS:  # not in the record, nor written back: at its default
            assert key not in cfg.to_dict() and value == type(value)()
        else:
            assert value == expected[key], key


def test_every_field_set_record_puts_values_where_named() -> None:
    cfg = TrainConfig.from_dict(FLAT_RECORDS["every-field-set"])
    assert (cfg.optim.lr, cfg.optim.arch_lr, cfg.optim.ema_decay) == (3e-3, {"smelt": 1e-3}, 0.9)
    assert (cfg.batch.size, cfg.batch.grad_accum, cfg.batch.row_len) == (8, 2, {"code": 64})
    assert (cfg.eval.every, cfg.eval.rows, cfg.eval.dyck_n, cfg.eval.dyck_demos) == (60, 3, 40, 2)
    assert (cfg.checkpoint.every, cfg.checkpoint.keep_until) == (40, 40)
    assert (cfg.runtime.parallel, cfg.runtime.threads, cfg.runtime.compile) == ("fsdp", 1, True)
    assert (cfg.schedule.branches, cfg.schedule.decay_shape) == ([60], "linear")
    assert cfg.corpus.paths == ["notes.txt"] and cfg.corpus.trigger.rate == 0.2
    assert (cfg.arch, cfg.seed, cfg.d_head_multiple) == ("smelt", 7, 8)
    assert cfg.tokens_per_step == 128 * 8 * 2


def test_the_alias_table_is_the_hand_written_one() -> None:
    derived = {key: ".".join(path) for key, path in FLAT_PATHS.items()}
    top = {k: v for k, v in WHERE.items() if "." not in v}
    assert derived == {k: v for k, v in WHERE.items() if k not in top}
    assert set(RENAMED) <= set(FLAT_PATHS) and set(SECTIONS).isdisjoint(WHERE)


# One new value per flat key, valid on dyck-pair-tiny.
NEW_VALUES = {
    "data": {"dyck": 0.5, "code": 0.5},
    "dyck": {"n_pairs": 3, "max_depth": 4, "min_len": 2, "max_len": 10},
    "trigger": {"rate": 0.3},
    "assoc_recall": {"alphabet": 12},
    "data_paths": ["a.txt"],
    "row_len": {"code": 64},
    "doc_rows": True,
    "dyck_packing": "whole",
    "seq_len": 96,
    "batch_size": 5,
    "grad_accum": 3,
    "lr": 7e-3,
    "arch_lr": {"smelt": 1e-3},
    "loop_lr_scale": 0.5,
    "weight_decay": 0.3,
    "beta1": 0.7,
    "beta2": 0.8,
    "grad_clip": 2.0,
    "ema_decay": 0.5,
    "load_balance_coef": 0.2,
    "z_loss_coef": 0.3,
    "min_lr_ratio": 0.4,
    "warmup_steps": 3,
    "steps": 90,
    "branches": [30],
    "decay_fraction": 0.5,
    "decay_shape": "linear",
    "eval_every": 7,
    "eval_rows": 5,
    "dyck_eval_n": 9,
    "dyck_eval_demos": 1,
    "ckpt_every": 11,
    "keep_ckpts_until": 22,
    "device": "cpu",
    "compile": True,
    "parallel": "fsdp",
    "threads": 3,
    "seed": 5,
    "arch": "smelt",
    "d_head_multiple": 8,
}


@pytest.mark.parametrize("key", sorted(NEW_VALUES))
def test_a_flat_override_and_its_path_set_the_same_field(key: str) -> None:
    base = TrainConfig.from_dict(get_preset("dyck-pair-tiny"))
    value = NEW_VALUES[key]
    by_key = base.with_overrides({key: value})
    by_path = base.with_overrides({WHERE[key]: value})
    assert by_key == by_path != base
    section, _, name = WHERE[key].partition(".")
    if name:  # the section given whole, as a JSON config file may
        assert base.with_overrides({section: {name: value}}) == by_key
    saved = by_key.to_dict()[key]
    if key in ("dyck", "trigger", "assoc_recall"):  # a spec's record names all its fields
        saved = {name: saved[name] for name in value}
    assert saved == json.loads(json.dumps(value))


def test_sub_fields_take_either_spelling() -> None:
    base = TrainConfig.from_dict(get_preset("dyck-pair"))
    for old, new in [
        ("dyck.p_open", "corpus.dyck.p_open"),
        ("data.code", "corpus.weights.code"),
        ("arch_lr.smelt", "optim.arch_lr.smelt"),
        ("row_len.code", "batch.row_len.code"),
    ]:
        value = 64 if "row_len" in old else 0.25
        assert base.with_overrides({old: value}) == base.with_overrides({new: value}) != base, old
    assert base.with_overrides({"model.d_model": 64}).model.d_model == 64
    assert base.corpus.dyck.p_open == 0.6 and base.corpus.weights == {"dyck": 0.9, "code": 0.1}


def test_a_preset_in_sections_is_the_same_run_as_its_flat_form() -> None:
    flat = get_preset("dyck-pair-tiny")
    sectioned = {
        "model": flat["model"],
        "corpus": {"weights": flat["data"], "dyck": flat["dyck"]},
        "batch": {"seq_len": 128, "size": 8},
        "optim": {"lr": 3e-3},
        "schedule": {"warmup_steps": 10, "steps": 120, "decay_fraction": 0.25},
        "eval": {"every": 60, "dyck_n": 40, "rows": 4},
        "checkpoint": {"every": 40},
    }
    assert TrainConfig.from_dict(sectioned) == TrainConfig.from_dict(flat)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_round_trips_through_its_record(name: str) -> None:
    cfg = TrainConfig.from_dict(get_preset(name))
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (
            {"weights": {"code": 1.0}},
            "unknown training field 'weights'; did you mean corpus.weights",
        ),
        ({"every": 3}, "did you mean eval.every or checkpoint.every"),
        ({"optim.learning_rate": 1e-3}, "optim has no field 'learning_rate'"),
        ({"optim": 1e-3}, "optim is a section"),
        ({"lr.peak": 1e-3}, "lr has no sub-fields"),
        ({"optim.lr.peak": 1e-3}, "optim has no sub-fields"),
        ({"batch.size": 0}, "batch.size (batch_size) must be a positive integer"),
        ({"eval": {"every": "often"}}, "eval.every (eval_every) must be a positive integer"),
    ],
)
def test_a_key_or_value_that_names_nothing_is_one_line(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({**get_preset("dyck-pair-tiny"), **data})
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_sectioned_lr_on_the_command_line_applies_to_both_architectures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from smelt_interp.train import presets

    rated = {**presets.PRESETS["dyck-pair-tiny"], "lr": 2e-3, "arch_lr": {"smelt": 3e-3}}
    monkeypatch.setitem(presets.PRESETS, "rated-pair", rated)
    pair = pair_configs(build_config("rated-pair", None, ["optim.lr=1e-3"]))
    assert pair["smelt"].optim.lr == pair["baseline"].optim.lr == 1e-3
    pair = pair_configs(build_config("rated-pair", None, ["optim.lr=1e-3", "arch_lr.smelt=5e-3"]))
    assert (pair["baseline"].optim.lr, pair["smelt"].optim.lr) == (1e-3, 5e-3)
    config = tmp_path / "c.json"
    config.write_text('{"optim": {"lr": 4e-3}, "schedule": {"steps": 500}}')
    pair = pair_configs(build_config("rated-pair", str(config), []))
    assert pair["smelt"].optim.lr == 4e-3 and pair["baseline"].schedule.steps == 500
