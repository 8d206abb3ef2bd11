"""Opening a model, of any kind the workbench reads, as one protocol (model.protocol's
LoopedModel): a ckpt.pt (SmeltModel, through smelt_interp.checkpoint) or a local transformers
folder (smelt_interp.adapters), with what else it came with (CheckpointInfo: its tokenizer, its
training record). Probes, the report, the dashboard and the notebooks open models only here, so
nothing above this module knows which kind it holds."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from smelt_interp.adapters.inference_loop import Loop, parse_loop, split_loop_name
from smelt_interp.checkpoint import CheckpointInfo, load_checkpoint
from smelt_interp.data.bpe import Tokenizer, checkpoint_tokenizer
from smelt_interp.data.folder_tokenizer import folder_tokenizer
from smelt_interp.errors import CheckpointError
from smelt_interp.model.protocol import LoopedModel
from smelt_interp.resources import parse_device


def load_model(
    path: str | Path,
    device: str | torch.device | None = None,
    allow_remote_code: bool = False,
    loop: str | Loop | None = None,
) -> tuple[LoopedModel, CheckpointInfo]:
    """A ckpt.pt, or a local transformers folder of a looped or dense model
    (smelt_interp.adapters) with its own tokenizer (or ids only, where it holds none) in the
    info. A folder is taken for a transformers folder; transformers is imported only then (it
    takes seconds). `allow_remote_code`: a folder may run the modeling file it ships
    (trust_remote_code). `loop` ('12:18x2', or a path written `FOLDER@12:18x2`): a dense
    folder's layers START..END-1 run R times at inference (adapters.inference_loop)."""
    target = device if isinstance(device, torch.device) else parse_device(device)
    path, loop = _with_loop(path, loop)
    if not Path(path).is_dir():
        if loop is not None:
            raise CheckpointError(
                f"{path}: --loop {loop.text} needs a transformers folder of a dense model; a "
                f"ckpt.pt keeps the loop it was trained with"
            )
        return load_checkpoint(path, device=target)
    from smelt_interp.adapters import load_looped

    model = load_looped(path, device=target, allow_remote_code=allow_remote_code, loop=loop)
    tokenizer = folder_tokenizer(path, model.cfg.vocab_size, model.cfg.first_token_id)
    return model, CheckpointInfo(Path(path), arch=model.cfg.arch, tokenizer=tokenizer)


def _with_loop(path: str | Path, loop: str | Loop | None) -> tuple[Path, Loop | None]:
    """The folder and loop that `path` (perhaps FOLDER@SPAN) and `loop` name together; a
    CheckpointError line for a malformed span or two different loops."""
    base, named = split_loop_name(path)
    try:
        given = parse_loop(loop) if isinstance(loop, str) else loop
    except ValueError as exc:
        raise CheckpointError(f"{base}: {exc}") from None
    if named is not None and given is not None and named != given:
        raise CheckpointError(f"{path}: names loop {named.text} and --loop {given.text}; one only")
    return base, named or given


def model_tokenizer(info: CheckpointInfo) -> Tokenizer:
    """The tokenizer a model came with: a folder's own, else the one its checkpoint carries."""
    return info.tokenizer if info.tokenizer is not None else checkpoint_tokenizer(info.meta)


def load_models(
    paths: Sequence[Path],
    device: str | None,
    allow_remote_code: bool = False,
    loop: str | Loop | None = None,
) -> tuple[dict[str, LoopedModel], dict[str, CheckpointInfo]]:
    """Checkpoints or model folders by a short unique label (the config's name, with its
    inference loop, else the file's stem), and what else each held, by the same labels.
    `loop` applies to the first path only (the others may name theirs as FOLDER@SPAN)."""
    target = parse_device(device)
    loaded = [
        load_model(p, target, allow_remote_code, loop if i == 0 else None)
        for i, p in enumerate(paths)
    ]
    labels = [m.cfg.name or Path(p).stem for (m, _), p in zip(loaded, paths)]
    if len(set(labels)) < len(labels):
        labels = [Path(p).stem for p in paths]
    if len(set(labels)) < len(labels):
        labels = [f"{lab}#{i + 1}" for i, lab in enumerate(labels)]
    models = {label: model for label, (model, _) in zip(labels, loaded)}
    return models, {label: info for label, (_, info) in zip(labels, loaded)}
