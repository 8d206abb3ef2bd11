"""The config is built once: a command's preset, file and `--set` fields become one TrainConfig
through a single read of plain data, and everything after that (the overrides, the pair's two
configs) is a typed copy, never a trip through a dict. The typed path writes the same records
as the dict path it replaced, for every preset, both architectures, with and without flat and
sectioned overrides (tests/data/pair_records.json, written by that earlier code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smelt_interp.train.build import build_config
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import PRESETS
from smelt_interp.train.trainer import pair_configs

RECORDS = json.loads(
    (Path(__file__).resolve().parents[1] / "data" / "pair_records.json").read_text("utf-8")
)
# The override sets the records were written with: none, then flat keys mixed with paths.
OVERRIDES = (
    [],
    ["lr=3e-3", "batch_size=8", "data.dyck=0.5", "optim.beta2=0.99", "keep_ckpts_until=200"],
)


# The presets that existed when the records were written (a later one has no dict-path record).
RECORDED = sorted({key.split("/")[0] for key in RECORDS})


def test_the_records_cover_presets_that_still_exist():
    assert set(RECORDED) <= set(PRESETS) and len(RECORDED) >= 9


@pytest.mark.parametrize("preset", RECORDED)
@pytest.mark.parametrize("which", range(len(OVERRIDES)))
def test_the_typed_path_writes_the_records_the_dict_path_wrote(preset, which):
    pair = pair_configs(build_config(preset, None, list(OVERRIDES[which])))
    for arch, cfg in pair.items():
        want = RECORDS[f"{preset}/{which}/{arch}"]
        assert json.loads(json.dumps(cfg.to_dict(), default=str)) == want


def test_plain_data_is_read_once_and_never_written_on_the_way(monkeypatch):
    """From the command line to the pair's configs: one from_dict (the preset), no to_dict."""
    calls = {"from_dict": 0, "to_dict": 0}
    from_dict, to_dict = TrainConfig.from_dict.__func__, TrainConfig.to_dict

    def counted_from_dict(cls, data):
        calls["from_dict"] += 1
        return from_dict(cls, data)

    def counted_to_dict(self):
        calls["to_dict"] += 1
        return to_dict(self)

    monkeypatch.setattr(TrainConfig, "from_dict", classmethod(counted_from_dict))
    monkeypatch.setattr(TrainConfig, "to_dict", counted_to_dict)
    base = build_config("recall-pair", None, ["lr=1e-3", "batch.size=4", "data.recall=1.0"])
    pair = pair_configs(base)
    assert calls == {"from_dict": 1, "to_dict": 0}
    assert base.optim.lr == 1e-3 and base.batch.size == 4
    assert {cfg.optim.lr for cfg in pair.values()} == {1e-3}
