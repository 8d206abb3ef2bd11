"""Checkpoints: exact round trips, atomic writes that survive a crash mid-save, and one-line
CheckpointErrors naming the file for everything that is not a smelt-interp checkpoint."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
import torch

from smelt_interp import checkpoint as ckpt_mod
from smelt_interp.checkpoint import CheckpointInfo, load_checkpoint, read_info, save_checkpoint
from smelt_interp.errors import CheckpointError


def test_round_trip(tiny_model, make_tokens, tmp_path: Path) -> None:
    tiny_model.train()
    path = save_checkpoint(
        tmp_path / "run" / "ckpt.pt", tiny_model, step=120, loss=1.25, tags=["a", "b"]
    )
    loaded, info = load_checkpoint(path)
    tokens = make_tokens(2, 9)
    with torch.no_grad():
        assert torch.equal(loaded(tokens), tiny_model.eval()(tokens))
    assert loaded.cfg == tiny_model.cfg and loaded.cfg.name == tiny_model.cfg.name
    assert info == CheckpointInfo(path, step=120, meta={"loss": 1.25, "tags": ["a", "b"]})
    assert info.arch is None and info.final and info.train_config is None and info.eval == {}
    assert not loaded.training and not hasattr(loaded, "meta")
    assert sorted(os.listdir(path.parent)) == ["ckpt.pt"]  # no temp file left behind


def test_crash_during_save_keeps_previous_file(
    tiny_model, make_model, make_tokens, tmp_path, monkeypatch
) -> None:
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, tiny_model, step=1)
    before = path.read_bytes()

    def crash(obj, fh, *args, **kwargs):
        fh.write(b"PK\x03\x04 half a zip")  # some bytes reach the disk, then the crash
        raise KeyboardInterrupt("killed while saving")

    monkeypatch.setattr(ckpt_mod.torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, make_model(tiny_model.cfg, seed=1), step=2)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]
    loaded, info = load_checkpoint(path)
    assert info.step == 1 and info.meta == {}
    with torch.no_grad():
        tokens = make_tokens(1, 5)
        assert torch.equal(loaded(tokens), tiny_model(tokens))


def test_trainer_metadata_is_typed_and_readable_without_the_model(tiny_model, tmp_path) -> None:
    saved = {
        "arch": "smelt",
        "step": 40,
        "final": False,
        "eval": {"loss/dyck": 0.5},
        "train_config": {"seq_len": 64},
        "tokens": 5120,
        "branch": 40,
    }
    path = save_checkpoint(tmp_path / "ckpt.pt", tiny_model, **saved)
    _, info = load_checkpoint(path)
    assert (info.path, info.arch, info.step, info.final) == (path, "smelt", 40, False)
    assert info.eval == {"loss/dyck": 0.5} and info.train_config == {"seq_len": 64}
    assert info.meta == {"tokens": 5120, "branch": 40}
    assert read_info(path) == info
    with pytest.raises(AttributeError):
        info.step = 41  # type: ignore[misc]  # a frozen record


class _RunsCode:
    """Unpickling this calls os.system, which creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def _assert_one_line_error(path: Path, needle: str = "") -> CheckpointError:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    assert needle in message
    return info.value


def test_code_running_pickle_is_refused(tiny_model, tmp_path: Path) -> None:
    # the payload is live: a plain unpickle would run it
    probe, probe_marker = tmp_path / "probe.pt", tmp_path / "probe-ran"
    torch.save({"x": _RunsCode(probe_marker)}, probe)
    torch.load(probe, weights_only=False)
    assert probe_marker.exists()
    # inside an otherwise valid checkpoint, load_checkpoint refuses it without running it
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    payload = {
        "format": "smelt-interp",
        "version": 1,
        "config": tiny_model.cfg.to_dict(),
        "state_dict": tiny_model.state_dict(),
        "meta": {"x": _RunsCode(marker)},
    }
    torch.save(payload, path)
    _assert_one_line_error(path, "refused")
    assert not marker.exists()


def _truncated(tiny_model, tmp_path: Path) -> Path:
    path = save_checkpoint(tmp_path / "ckpt.pt", tiny_model)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _random_bytes(tiny_model, tmp_path: Path) -> Path:
    path = tmp_path / "noise.pt"
    path.write_bytes(
        torch.randint(
            0, 256, (4096,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8
        )
        .numpy()
        .tobytes()
    )
    return path


def _text_file(tiny_model, tmp_path: Path) -> Path:
    path = tmp_path / "notes.pt"  # a legacy-format pickle read of text fails with IndexError
    path.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n")
    return path


def _other_config(tiny_model, tmp_path: Path) -> Path:
    other = type(tiny_model)(tiny_model.cfg.replace(d_model=48))
    path = tmp_path / "mixed.pt"
    torch.save(
        {
            "format": "smelt-interp",
            "version": 1,
            "config": tiny_model.cfg.to_dict(),
            "state_dict": other.state_dict(),
            "meta": {},
        },
        path,
    )
    return path


def _missing(tiny_model, tmp_path: Path) -> Path:
    return tmp_path / "nope.pt"


def _directory(tiny_model, tmp_path: Path) -> Path:
    (tmp_path / "dir.pt").mkdir()
    return tmp_path / "dir.pt"


def _foreign(tiny_model, tmp_path: Path) -> Path:
    path = tmp_path / "plain.pt"
    torch.save(tiny_model.state_dict(), path)
    return path


def _bad_config(tiny_model, tmp_path: Path) -> Path:
    path = tmp_path / "badcfg.pt"
    torch.save(
        {
            "format": "smelt-interp",
            "version": 1,
            "config": {**tiny_model.cfg.to_dict(), "top_k": 99},
            "state_dict": tiny_model.state_dict(),
            "meta": {},
        },
        path,
    )
    return path


def _bad_meta(tiny_model, tmp_path: Path) -> Path:
    return save_checkpoint(tmp_path / "badmeta.pt", tiny_model, step="twelve")


def _future_version(tiny_model, tmp_path: Path) -> Path:
    path = tmp_path / "v9.pt"
    torch.save({"format": "smelt-interp", "version": 9}, path)
    return path


@pytest.mark.parametrize(
    "make_bad, needle",
    [
        (_truncated, "not a readable checkpoint"),
        (_random_bytes, "not a readable checkpoint"),
        (_text_file, "not a readable checkpoint"),
        (_other_config, "do not fit"),
        (_missing, "no such"),
        (_directory, "folder"),
        (_foreign, "not a smelt-interp checkpoint"),
        (_bad_config, "top_k"),
        (_bad_meta, "invalid metadata, step"),
        (_future_version, "version"),
    ],
    ids=lambda f: getattr(f, "__name__", "").strip("_") or None,
)
def test_bad_files_raise_one_line_error(tiny_model, tmp_path: Path, make_bad, needle: str) -> None:
    _assert_one_line_error(make_bad(tiny_model, tmp_path), needle)
