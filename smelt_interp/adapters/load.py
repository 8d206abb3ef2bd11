"""Loading a local transformers folder as a LoopedAdapter, refusing what cannot be analysed.

Every refusal is one CheckpointError line naming the folder: no config.json, a JSON file of the
folder that asks for remote code (an `auto_map`, in config.json, tokenizer_config.json or any
other) the user did not allow, an architecture the adapter does not know, a loop count past
MAX_LOOP_COUNT or a schedule past MAX_VISITS (checked before anything is built), weights that
are missing, unexpected or shaped unlike the config. Nothing is fetched (local_files_only) and
transformers is always told whether remote code may run, so it never asks on standard input."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from smelt_interp.adapters.dense import Dense
from smelt_interp.adapters.dory import Dory
from smelt_interp.adapters.hrm_text import HrmText
from smelt_interp.adapters.inference_loop import Loop, apply_loop, loop_label
from smelt_interp.adapters.inkling import Inkling
from smelt_interp.adapters.looped import (
    Arch,
    LoopedAdapter,
    LoopedShape,
)
from smelt_interp.errors import CheckpointError
from smelt_interp.files import read_json_input
from smelt_interp.plugins import installed

PLUGIN_GROUP = "smelt_interp.adapters"  # entry points of installed packages' Archs
ARCHS: dict[str, Arch] = {
    t: arch for arch in (HrmText(), Dory(), Inkling(), Dense()) for t in arch.model_types
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
MAX_CONFIG_BYTES = 64 * 2**20  # a config or tokenizer_config.json is a few KiB
MAX_LOOP_COUNT = 1024  # one declared loop count: real looped models run 2..128 passes
MAX_VISITS = 4096  # layer visits in one forward pass: each has its own hook points


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def register_arch(arch: Arch) -> Arch:
    """Teach the adapter another looped architecture (an Arch subclass for its model_types),
    e.g. one whose modeling file a folder ships (Ouro, Huginn: load_looped(...,
    allow_remote_code=True)). Returns it; a model_type already known is refused."""
    taken = [t for t in arch.model_types if t in ARCHS]
    if not arch.model_types or taken:
        raise ValueError(f"{type(arch).__name__}: model_types {taken or '()'} known already")
    ARCHS.update({t: arch for t in arch.model_types})
    return arch


def known_archs() -> str:
    """The model types the adapter knows (each Arch's first), for messages."""
    return ", ".join(dict.fromkeys(arch.model_types[0] for arch in ARCHS.values()))


def load_plugins() -> None:
    """Register the Archs installed packages declare as entry points of PLUGIN_GROUP (each
    naming an Arch instance: `ouro = "my_package.ouro:ARCH"`), once; one naming anything else
    is a CheckpointError line."""
    for _, arch in installed(PLUGIN_GROUP, Arch, "adapter plugin", CheckpointError):
        if not all(t in ARCHS for t in arch.model_types):
            register_arch(arch)


def arch_of(model_type: str, where: str) -> Arch:
    """The adapter's Arch for `model_type` (looking in installed plugins for one it does not
    ship), or a CheckpointError naming the known ones."""
    if model_type not in ARCHS:
        load_plugins()
    try:
        return ARCHS[model_type]
    except KeyError:
        known = known_archs()
        raise CheckpointError(
            f"{where}: unknown architecture {model_type!r}; the adapter knows {known}"
        ) from None


def adapt(
    hf: nn.Module,
    *,
    name: str | None = None,
    first_token_id: int | None = None,
    loop: Loop | None = None,
) -> LoopedAdapter:
    """Wrap an in-memory transformers model (one of ARCHS) with per-visit hook points, a dense
    one looped at inference by `loop` (adapters.inference_loop). The adapter takes hf over:
    eval mode, its attention switched to the capture function."""
    config = hf.config
    arch = arch_of(config.model_type, name or config.model_type)
    layers = arch.layers(hf)
    check_loops(arch, config, name or config.model_type, n_layers=len(layers))
    schedule = arch.schedule(config)
    if loop is not None:
        schedule = apply_loop(arch, hf, len(layers), loop, name or config.model_type)
    try:
        shape = arch.shape(config)
    except ValueError as exc:
        raise CheckpointError(f"{name or config.model_type}: {_one_line(exc)}") from exc
    cfg = LoopedShape(
        name=loop_label(name or config.model_type, loop),
        arch=config.model_type,
        vocab_size=hf.get_output_embeddings().out_features,
        n_layers=len(layers),
        schedule=schedule,
        first_token_id=first_token_id,
        learned_sinks=arch.learned_sinks,
        layer_names=tuple(path for path, _ in layers),
        **shape,
    )
    return LoopedAdapter(hf.eval(), arch, cfg)


def _read_config(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a folder")
    path = folder / "config.json"
    if not path.exists():
        raise CheckpointError(f"{folder}: no config.json, not a transformers model folder")
    raw = read_json_input(path, MAX_CONFIG_BYTES, CheckpointError, "config.json")
    if not isinstance(raw, dict):
        raise CheckpointError(f"{folder}: config.json does not hold an object")
    return raw


def _asks_remote_code(value: Any) -> bool:
    """Whether an `auto_map` key stands anywhere in a parsed JSON value (walked without
    recursion; a composite model's sub-config may carry it)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("auto_map"):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def check_remote_code(folder: Path, allow_remote_code: bool) -> None:
    """Refuse a folder any of whose JSON files (config.json, tokenizer_config.json, a processor
    config...) names code of its own (`auto_map`) unless the user allowed it: transformers would
    otherwise run that code, or ask on standard input. tokenizer.json is read without
    transformers (data.folder_tokenizer) and holds no auto_map that anything acts on."""
    if allow_remote_code:
        return
    for path in sorted(folder.glob("*.json")):
        if path.name == "tokenizer.json":
            continue
        if _asks_remote_code(read_json_input(path, MAX_CONFIG_BYTES, CheckpointError, path.name)):
            raise CheckpointError(
                f"{folder}: its {path.name} asks for trust_remote_code (auto_map), so loading it "
                f"would run the folder's own Python; not allowed without --trust-remote-code"
            )


def check_loops(arch: Arch, config: Any, where: str, n_layers: int = 1) -> None:
    """Refuse loop counts the config declares (Arch.loop_counts) that are not whole numbers in
    1..MAX_LOOP_COUNT, or whose schedule would pass MAX_VISITS layer visits, before the schedule
    (or the model) is built: a count of 100,000 would take hours, one of 0 leaves a layer
    that never runs."""
    counts = arch.loop_counts(config)
    for key, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise CheckpointError(f"{where}: {key} is {str(value)[:40]!r}, not a whole number")
        if not 1 <= value <= MAX_LOOP_COUNT:
            raise CheckpointError(
                f"{where}: {key} is {value}; a loop count must be 1..{MAX_LOOP_COUNT}"
            )
    visits = math.prod(counts.values()) * n_layers
    if visits > MAX_VISITS:
        raise CheckpointError(
            f"{where}: its loop counts ({', '.join(f'{k} {v}' for k, v in counts.items())}) make "
            f"up to {visits:,} layer visits a forward pass, more than {MAX_VISITS:,}"
        )


def first_token_of(folder: Path, allow_remote_code: bool = False) -> int | None:
    """The id the folder's tokenizer puts before a row's text (its BOS: the one token it adds
    in front, whether its config names it bos_token or only its post-processor adds it), else
    None (no tokenizer, or one that adds none: the first position stands in for BOS)."""
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(
            folder, local_files_only=True, trust_remote_code=allow_remote_code
        )
    except Exception as exc:  # noqa: BLE001 (any tokenizer failure: one line)
        raise CheckpointError(f"{folder}: unreadable tokenizer ({_one_line(exc)})") from exc
    plain = tok("a", add_special_tokens=False)["input_ids"]
    marked = tok("a", add_special_tokens=True)["input_ids"]
    lead = marked[: len(marked) - len(plain)] if marked[len(marked) - len(plain) :] == plain else []
    return int(lead[0]) if len(lead) == 1 else None


def load_looped(
    folder: str | os.PathLike[str],
    *,
    device: Any = None,
    allow_remote_code: bool = False,
    loop: Loop | None = None,
) -> LoopedAdapter:
    """A local transformers folder (hrm_text, dory, inkling2_loop; llama, mistral, looped at
    inference by `loop`) as a LoopedAdapter, float32, eval mode, on `device` (default CPU)."""
    import transformers
    from transformers.utils import logging as hf_logging

    folder = Path(folder)
    raw = _read_config(folder)
    check_remote_code(folder, allow_remote_code)  # before transformers reads any of it
    model_type = str(raw.get("model_type"))
    arch = arch_of(model_type, str(folder))  # refuse before building anything
    if loop is not None and arch.loops:
        apply_loop(arch, None, 0, loop, str(folder))  # refuses a model that loops already
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # its load report is many lines; ours is one
    hf_logging.disable_progress_bar()  # and its progress bar one more on every command
    try:
        config = transformers.AutoConfig.from_pretrained(
            folder, local_files_only=True, trust_remote_code=allow_remote_code
        )
        check_loops(arch, config, str(folder))  # before the model is built
        hf, info = getattr(transformers, arch.auto_class(model_type)).from_pretrained(
            folder,
            config=config,
            local_files_only=True,
            trust_remote_code=allow_remote_code,
            attn_implementation="eager",  # adapt switches the decoder layers to the capture
            dtype=torch.float32,
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # reported below in one line, not raised
        )
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 (transformers raises many kinds: one line)
        raise CheckpointError(f"{folder}: cannot load the model ({_one_line(exc)})") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    bad = {
        kind: sorted(str(k) for k in info.get(kind) or ())
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")
    }
    bad = {kind: keys for kind, keys in bad.items() if keys}
    if bad:
        kind, keys = next(iter(bad.items()))
        raise CheckpointError(
            f"{folder}: weights do not match the config ({len(keys)} {kind.replace('_', ' ')}, "
            f"e.g. {keys[0]})"
        )
    first = first_token_of(folder, allow_remote_code)
    adapter = adapt(hf, name=folder.resolve().name, first_token_id=first, loop=loop)
    return adapter.to(device) if device is not None else adapter
