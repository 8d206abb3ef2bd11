"""A run's TrainConfig from what a command was given: a preset, then a JSON config file, then
`--set key=value` overrides (values are JSON when they parse, else strings). The training
command and the seeds command build their configs here.

Plain data stops here: the preset is read once into a TrainConfig (`TrainConfig.from_dict`),
and the file's and `--set`'s fields are applied to it typed (`TrainConfig.with_overrides`);
what a command does with the config after that (pair_configs, a seed, a thread count) is a
typed copy too, never a trip through a dict."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smelt_interp.errors import ConfigError
from smelt_interp.files import parse_json, read_json_input
from smelt_interp.train.config import TrainConfig, resolve_overrides
from smelt_interp.train.presets import get_preset

MAX_CONFIG_BYTES = 1 << 20  # a config file is a few hundred bytes; a FIFO or /dev/zero never ends


def parse_override(text: str) -> tuple[str, Any]:
    """'steps=200' -> ('steps', 200); values are JSON when they parse, else strings (a value
    the JSON parser cannot hold, nested too deep or a huge number, is a ConfigError)."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"expected key=value, got {text[:80]!r}")
    try:
        return key, parse_json(raw, f"--set {key[:80]}")
    except json.JSONDecodeError:
        return key, raw


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The JSON object of a --config file: a regular file of at most MAX_CONFIG_BYTES, read
    before it is parsed (see files.open_input and files.parse_json)."""
    path = Path(path)
    data = read_json_input(path, MAX_CONFIG_BYTES, ConfigError, "config file")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file holds a JSON object")
    return data


def config_layers(
    preset: str | None, config_file: str | None, overrides: Sequence[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the preset's data, the user's fields: the config file's, then `--set` overrides)."""
    data = get_preset(preset) if preset else {}
    user = load_config_file(config_file) if config_file else {}
    user.update(dict(parse_override(o) for o in overrides))
    return data, user


def config_from(data: dict[str, Any], user: dict[str, Any]) -> TrainConfig:
    """The preset's data with the user's fields on top. A learning rate the user gives (`lr` or
    `optim.lr`) applies to both architectures: it replaces the preset's `arch_lr` unless
    `arch_lr` is given alongside it."""
    given = {o.path for o in resolve_overrides(user)}
    if ("optim", "lr") in given and ("optim", "arch_lr") not in given:
        user = {"optim.arch_lr": {}, **user}
    cfg = TrainConfig.from_dict(data)
    return cfg.with_overrides(user) if user else cfg


def build_config(
    preset: str | None, config_file: str | None, overrides: Sequence[str]
) -> TrainConfig:
    """Preset, then config file, then `--set` overrides (see config_from)."""
    return config_from(*config_layers(preset, config_file, overrides))
