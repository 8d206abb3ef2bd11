"""`ckpt.pt`: one file holding the config, the weights and plain metadata. `load_checkpoint`
returns the model and a `CheckpointInfo`, the typed record of everything else the file held.

Writes are atomic (a temp file in the same folder, fsync, then rename), so a run killed while
saving leaves the previous checkpoint intact. Loads use `torch.load(weights_only=True)`, so a
pickle that would run code is refused, and every failure is one CheckpointError line."""

from __future__ import annotations

import os
import pickle
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from smelt_interp.config import ModelConfig
from smelt_interp.errors import CheckpointError, ConfigError
from smelt_interp.files import atomic_torch_save, open_input
from smelt_interp.machine import memory_limit_bytes
from smelt_interp.model.transformer import SmeltModel

FORMAT = "smelt-interp"
VERSION = 1


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint file held besides the model. The trainer saves `arch`, `step`, `final`,
    `eval` and `train_config` (its TrainConfig as a dict); a checkpoint saved by other code may
    hold none of them. `meta` keeps every other saved field (tokens, branch, budgets, ...)."""

    path: Path
    arch: str | None = None
    step: int | None = None
    final: bool = True  # False for a trainer's periodic checkpoint of a run still going
    eval: dict[str, float] = field(default_factory=dict)  # measures at the final evaluation
    train_config: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # A model folder's own tokenizer object (smelt_interp.data.folder_tokenizer), for a model
    # loaded from a transformers folder; a checkpoint's is in `meta` as {json, hash}.
    tokenizer: Any = None

    @classmethod
    def from_meta(cls, path: str | os.PathLike[str], meta: Mapping[str, Any]) -> CheckpointInfo:
        """The record of a file's saved metadata; a typed field of the wrong type is an error."""
        if not isinstance(meta, Mapping):
            raise CheckpointError(f"{path}: invalid metadata, a {type(meta).__name__}")
        rest = dict(meta)
        typed = {
            "arch": (rest.pop("arch", None), (str, type(None))),
            "step": (rest.pop("step", None), (int, type(None))),
            "final": (rest.pop("final", True), bool),
            "eval": (rest.pop("eval", None), (dict, type(None))),
            "train_config": (rest.pop("train_config", None), (dict, type(None))),
        }
        for name, (value, kind) in typed.items():
            if not isinstance(value, kind):
                raise CheckpointError(
                    f"{path}: invalid metadata, {name} is a {type(value).__name__}"
                )
        measures = typed["eval"][0] or {}
        if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in measures.values()
        ):
            raise CheckpointError(
                f"{path}: invalid metadata, eval holds a value that is not a number"
            )
        fields = {name: value for name, (value, _) in typed.items()}
        return cls(Path(path), **{**fields, "eval": measures}, meta=rest)


def save_checkpoint(
    path: str | os.PathLike[str],
    model: SmeltModel,
    *,
    weights: Mapping[str, torch.Tensor] | None = None,
    **meta: Any,
) -> Path:
    """Save `model` (config + state dict) and JSON-like `meta` to `path` atomically. `weights`
    replaces the model's own state dict: a sharded model's full weights, gathered beforehand."""
    source = model.state_dict() if weights is None else weights
    state = {k: v.detach().cpu() for k, v in source.items()}
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "config": model.cfg.to_dict(),
        "state_dict": state,
        "meta": meta,
    }
    return atomic_torch_save(payload, path)


def read_payload(path: str | os.PathLike[str]) -> dict[str, Any]:
    """torch.load(weights_only=True) with each failure mapped to one CheckpointError line. The
    file is checked first (see files.open_input): a regular file no larger than the memory this
    process may use; a folder, a device or a FIFO is refused before anything is read."""
    path = Path(path)
    with open_input(path, memory_limit_bytes(), CheckpointError, "checkpoint") as fh:
        head = fh.read(2)
        if len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= pickle.HIGHEST_PROTOCOL:
            raise CheckpointError(
                f"{path}: a legacy (non-zip) pickle, which will not be loaded; only the zip "
                f"format of torch.save is read"
            )
        fh.seek(0)
        payload = load_weights_only(path, fh)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a smelt-interp checkpoint (no '{FORMAT}' header)")
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {str(payload.get('version'))[:40]!r} is not "
            f"supported (expected {VERSION})"
        )
    return payload


def load_weights_only(path: Path, fh: BinaryIO, map_location: Any = "cpu") -> Any:
    """torch.load(fh, weights_only=True) of the file `path`, every failure one CheckpointError."""
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols: we say it all
            warnings.simplefilter("ignore")
            return torch.load(fh, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch wraps every weights-only failure in the same "Weights only load failed"
        # preamble; only a blocked GLOBAL means objects that would run code, anything else
        # (e.g. "Unsupported operand") is a corrupt file.
        if "global" in str(exc).lower():
            raise CheckpointError(
                f"{path}: refused, the file holds objects that would run code "
                f"when loaded (only weights and plain data are allowed)"
            ) from None
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or corrupt)") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: not a readable checkpoint ({exc})") from None
    except Exception:  # noqa: BLE001 - any other file (text, random bytes) fails in its own way
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or corrupt)") from None


def check_weights(path: str | os.PathLike[str], state: Any) -> dict[str, torch.Tensor]:
    """`state` if it is a dict of real-valued, finite tensors keyed by name; else one
    CheckpointError line (a key that is not a name, a complex or diverged tensor)."""
    if not isinstance(state, Mapping) or not all(torch.is_tensor(v) for v in state.values()):
        raise CheckpointError(f"{path}: invalid weights (state_dict is not a dict of tensors)")
    keys = [k for k in state if not isinstance(k, str)]
    if keys:
        raise CheckpointError(
            f"{path}: invalid weights (state_dict key {str(keys[0])[:40]!r} is a "
            f"{type(keys[0]).__name__}, not a parameter name)"
        )
    complex_ = [k for k, v in state.items() if v.is_complex()]
    if complex_:
        raise CheckpointError(
            f"{path}: {len(complex_)} weight tensors are complex-valued (e.g. "
            f"{complex_[0][:80]}); a model's weights are real"
        )
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(v.isfinite().all())]
    if bad:
        raise CheckpointError(
            f"{path}: {len(bad)} of {len(state)} weight tensors hold NaN or infinite values "
            f"(e.g. {bad[0][:80]}); a diverged model is not loaded"
        )
    return dict(state)


def read_info(path: str | os.PathLike[str]) -> CheckpointInfo:
    """A checkpoint's metadata without building its model."""
    return _info(path, read_payload(path))


def _info(path: str | os.PathLike[str], payload: dict[str, Any]) -> CheckpointInfo:
    meta = payload.get("meta")
    return CheckpointInfo.from_meta(path, {} if meta is None else meta)


def load_checkpoint(
    path: str | os.PathLike[str], device: str | torch.device = "cpu"
) -> tuple[SmeltModel, CheckpointInfo]:
    """The saved model in eval mode on `device`, and the record of what else the file held."""
    payload = read_payload(path)
    info = _info(path, payload)
    try:
        cfg = ModelConfig.from_dict(payload.get("config"))
        cfg.check_memory()  # before allocating anything the config asks for
    except ConfigError as exc:
        raise CheckpointError(f"{path}: invalid model config ({exc})") from None
    state = check_weights(path, payload.get("state_dict"))
    model = SmeltModel(cfg)
    try:
        model.load_state_dict(state, strict=True)
    except (RuntimeError, KeyError, TypeError) as exc:
        summary = str(exc).strip().splitlines()[0][:200]
        raise CheckpointError(f"{path}: weights do not fit its config ({summary})") from None
    return model.to(device).eval(), info
