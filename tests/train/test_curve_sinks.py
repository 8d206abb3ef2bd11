"""The training curves in TensorBoard and W&B (train.curve_sinks), read back from what each
logger wrote and checked against metrics.jsonl: the same scalars under the same names at the same
steps, a decay branch's apart; a resume continues the same TensorBoard folder (the redone steps
purged) and the same W&B run; other ranks write nothing; a missing package and a bad mode are
one line."""

from __future__ import annotations

import json
import struct
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from helpers.tiny_runs import TINY_MODEL, TINY_RUN

from smelt_interp.cli import run_cli
from smelt_interp.errors import ConfigError
from smelt_interp.train.__main__ import train_main
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.curve_sinks import WANDB_ID_FILE, open_sinks, run_name
from smelt_interp.train.sections import LogConfig
from smelt_interp.train.trainer import Trainer

# 12 steps, a decay branch to step 8 (from step 6), evaluations at 6, 8 (the branch) and 12
BRANCHED = {"branches": [8], "decay_fraction": 0.25, "eval_every": 6}


def tiny_cfg(log: dict[str, Any], **over: Any) -> TrainConfig:
    base = {**TINY_RUN, "model": TINY_MODEL, "steps": 12, "ckpt_every": 4, "dyck_eval_n": 8}
    cfg = TrainConfig.from_dict({**base, "threads": 1, **over})
    return cfg.with_overrides({f"log.{k}": v for k, v in log.items()})


@pytest.fixture(autouse=True)
def _quiet_local_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B offline, silent, its settings and caches in the test's folder, stdout left alone."""
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DIR": str(tmp_path / "wandb-dir"),
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def jsonl(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def expected_scalars(records: list[dict[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    """The rule, written out here rather than imported: every number of a record but `step`
    (bools not), under its name, a branch record's under `branch-H/`."""
    out = []
    for rec in records:
        prefix = f"branch-{rec['branch']}/" if "branch" in rec else ""
        values = {
            prefix + k: v
            for k, v in rec.items()
            if k not in ("step", "branch") and type(v) in (int, float)
        }
        out.append((rec["step"], values))
    return out


def by_tag(rows: list[tuple[int, dict[str, float]]]) -> dict[str, list[tuple[int, float]]]:
    tags: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for step, values in rows:
        for name, value in values.items():
            tags[name].append((step, value))
    return {name: sorted(points) for name, points in tags.items()}


def tensorboard_points(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar event TensorBoard shows for the run folder (purged ones left out)."""
    from tensorboard.backend.event_processing.event_accumulator import (
        SCALARS,
        EventAccumulator,
    )

    acc = EventAccumulator(str(folder), size_guidance={SCALARS: 0})  # 0: keep every event
    acc.Reload()
    return {
        tag: sorted((e.step, e.value) for e in acc.Scalars(tag)) for tag in acc.Tags()["scalars"]
    }


def assert_same_points(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for tag, points in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag


def wandb_records(path: Path) -> list[Any]:
    """The protobuf records of a `.wandb` file: W&B's record log, a 7-byte header (":W&B",
    magic, version) then 32 KiB blocks of chunks, each a 7-byte header (CRC, length, type:
    1 whole, 2 first, 3 middle, 4 last) and its bytes; under 7 bytes left in a block is padding."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B"
    pos, parts, records = 7, b"", []
    while pos + 7 <= len(data):
        room = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if room < 7 or (kind == 0 and length == 0):
            pos += room
            continue
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
            parts = b""
    return records


def wandb_run(out: Path) -> tuple[list[Any], list[dict[str, Any]]]:
    """The run records and the history rows (W&B's own `_` keys left out) of every offline
    run under `out/wandb`, oldest first."""
    runs, rows = [], []
    for path in sorted((out / "wandb").glob("offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                runs.append(record.run)
            elif kind == "history":
                items = {
                    item.key or ".".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
                rows.append({k: v for k, v in items.items() if not k.startswith("_")})
    return runs, rows


def test_tensorboard_holds_the_scalars_of_metrics_jsonl(tmp_path: Path) -> None:
    out, tb = tmp_path / "run", tmp_path / "tb"
    Trainer(tiny_cfg({"tensorboard": str(tb)}, **BRANCHED), out, progress=False).run()
    records = jsonl(out)
    assert {r["event"] for r in records} == {"train", "eval"}
    assert any("branch" in r for r in records)
    folder = tb / run_name(out)  # the run's folder and the one above it, tagged by its path
    assert run_name(out).startswith(f"{tmp_path.name}-") and run_name(out).endswith("/run")
    assert list(folder.glob("events.out.tfevents.*"))
    got, want = tensorboard_points(folder), by_tag(expected_scalars(records))
    assert {"loss", "lr", "tokens", "loss/dyck", "branch-8/loss", "branch-8/loss/dyck"} <= set(want)
    assert_same_points(got, want)
    assert [s for s, _ in got["loss"]] == list(range(1, 13))  # the branch's steps kept apart
    assert [s for s, _ in got["branch-8/loss"]] == [7, 8]
    assert not (out / "wandb").exists() and not (out / WANDB_ID_FILE).exists()


def test_wandb_offline_holds_the_scalars_of_metrics_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = tiny_cfg({"wandb": "offline"}, **BRANCHED)
    Trainer(cfg, out, progress=False).run()
    runs, rows = wandb_run(out)
    run_id = (out / WANDB_ID_FILE).read_text().strip()
    assert [r.run_id for r in runs] == [run_id] and runs[0].project == "smelt-interp"
    assert runs[0].display_name == run_name(out)
    config = {item.key: json.loads(item.value_json) for item in runs[0].config.update}
    assert config["lr"] == cfg.optim.lr and config["log"] == {"wandb": "offline"}
    # one history row per record, in order, its x axis the record's step
    want = [{"step": step, **values} for step, values in expected_scalars(jsonl(out))]
    assert rows == want
    final = {k: v for step, values in expected_scalars(jsonl(out)) for k, v in values.items()}
    assert {k: v for row in rows for k, v in row.items() if k != "step"} == final


def test_a_resume_continues_the_same_curves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    out, tb = tmp_path / "run", tmp_path / "tb"
    cfg = tiny_cfg({"tensorboard": str(tb), "wandb": "offline"}, eval_every=6)
    original = Trainer.train_step

    def dying_step(self: Trainer, lr: float):
        if self.step == 10:  # state.pt holds step 8; steps 9 and 10 are already logged
            raise KeyboardInterrupt("simulated kill")
        return original(self, lr)

    monkeypatch.setattr(Trainer, "train_step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        Trainer(cfg, out, progress=False).run()
    monkeypatch.setattr(Trainer, "train_step", original)
    folder = tb / run_name(out)
    assert max(s for s, _ in tensorboard_points(folder)["loss"]) == 10
    run_id = (out / WANDB_ID_FILE).read_text()
    Trainer(cfg, out, resume=True, progress=False).run()
    assert (out / WANDB_ID_FILE).read_text() == run_id  # the same W&B run, twice opened
    runs, rows = wandb_run(out)
    assert [r.run_id for r in runs] == [run_id.strip()] * 2
    assert [row["step"] for row in rows if "loss" in row] == [*range(1, 11), *range(9, 13)]
    # the same TensorBoard folder, two event files; steps 9 and 10 of the first are purged
    assert [p.name for p in tb.rglob("events.out.tfevents.*") if p.parent != folder] == []
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2
    got = tensorboard_points(folder)
    assert [s for s, _ in got["loss"]] == list(range(1, 13))  # each step once
    assert_same_points(got, by_tag(expected_scalars(jsonl(out))))


def test_other_ranks_open_and_write_nothing(tmp_path: Path) -> None:
    log = LogConfig(tensorboard=str(tmp_path / "tb"), wandb="offline")
    sinks = open_sinks(log, tmp_path / "out", "x/y", None, False, {"lr": 1e-3})
    sinks.write({"event": "train", "step": 1, "loss": 2.0})
    sinks.close()
    assert sinks.tensorboard is None and sinks.wandb_run is None
    assert list(tmp_path.iterdir()) == []


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The command's stderr, checked to be one `error:` line under exit code 2."""
    with pytest.raises(SystemExit) as info:
        run_cli(train_main, argv)
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


@pytest.mark.parametrize(
    ("key", "value", "module"),
    [("tensorboard", "TB", "torch.utils.tensorboard"), ("wandb", "offline", "wandb")],
)
def test_a_missing_package_is_one_line_naming_its_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, key: str, value: str, module: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # its import fails, as when not installed
    value = str(tmp_path / value) if key == "tensorboard" else value
    out = tmp_path / "o"
    argv = ["--preset", "dyck-pair-tiny", "--arch", "baseline", "--quiet", "--out", str(out)]
    err = one_line_error(capsys, [*argv, "--set", f"log.{key}={value}"])
    assert f"log.{key} needs the {key} package: pip install 'smelt-interp[{key}]'" in err
    assert not (out / "baseline" / "ckpt.pt").exists()  # refused before any training


def test_a_bad_wandb_mode_is_one_line_and_the_section_round_trips(tmp_path: Path, capsys):
    err = one_line_error(capsys, ["--set", "log.wandb=maybe", "--out", str(tmp_path / "o")])
    assert "log.wandb must be offline or online (or null: off), got 'maybe'" in err
    assert not (tmp_path / "o").exists()
    with pytest.raises(ConfigError, match="did you mean log.tensorboard"):
        tiny_cfg({}).with_overrides({"tensorboard": "tb"})
    with pytest.raises(ConfigError, match="log.tensorboard must be a folder path"):
        tiny_cfg({"tensorboard": 3})
    cfg = tiny_cfg({"tensorboard": "tb", "wandb": "online"})
    record = json.loads(json.dumps(cfg.to_dict()))
    assert record["log"] == {"tensorboard": "tb", "wandb": "online"}
    assert TrainConfig.from_dict(record) == cfg
    # a record of a run without the section (any run before it) loads with it off, has no key
    # for it, and is the same run as one that logs its curves (which trains nothing else)
    old = tiny_cfg({}).to_dict()
    assert "log" not in old and TrainConfig.from_dict(old).log == LogConfig()
    assert TrainConfig.from_dict(old).same_run(cfg) and cfg.same_run(TrainConfig.from_dict(old))
