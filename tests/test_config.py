"""ModelConfig: every impossible shape raises a ConfigError (a ValueError) naming its field, and
the schedule is the hand-written execution order for the paper's loop and its ablations."""

from __future__ import annotations

from typing import Any

import pytest

from smelt_interp.config import ModelConfig
from smelt_interp.errors import ConfigError

POSITIVE = (
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "d_head",
    "n_experts",
    "top_k",
    "d_expert",
    "n_loops",
    "max_seq_len",
)

IMPOSSIBLE: list[tuple[dict[str, Any], str]] = [
    ({"n_experts": 4, "top_k": 5}, "top_k"),
    ({"n_heads": 6, "n_kv_heads": 4}, "n_heads"),
    ({"n_heads": 4, "n_kv_heads": 3}, "n_kv_heads"),
    ({"n_layers": 4, "loop_start": 2, "loop_end": 5, "n_loops": 2}, "loop_end"),
    ({"n_layers": 4, "loop_start": -1, "loop_end": 2, "n_loops": 2}, "loop_start"),
    ({"n_layers": 4, "loop_start": 3, "loop_end": 2, "n_loops": 2}, "loop_start"),
    ({"d_head": 7}, "d_head"),
    ({"vocab_size": 259, "bos_token_id": 259}, "bos_token_id"),
    ({"bos_token_id": -1}, "bos_token_id"),
    ({"rope_theta": 0.0}, "rope_theta"),
    ({"norm_eps": -1e-6}, "norm_eps"),
    ({"d_model": 32.0}, "d_model"),
    ({"n_layers": True}, "n_layers"),
]
IMPOSSIBLE += [({name: value}, name) for name in POSITIVE for value in (0, -1)]


@pytest.mark.parametrize(
    "fields, field", IMPOSSIBLE, ids=[f"{f}={list(d.values())}" for d, f in IMPOSSIBLE]
)
def test_impossible_config_raises_value_error_naming_field(
    fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError) as info:
        ModelConfig(**fields)
    assert isinstance(info.value, ConfigError)
    assert field in str(info.value)
    assert "\n" not in str(info.value)


def test_default_config_is_valid_baseline() -> None:
    cfg = ModelConfig()
    assert not cfg.is_looped
    assert cfg.schedule == tuple((layer, 0) for layer in range(cfg.n_layers))


def _layers(cfg: ModelConfig) -> tuple[int, ...]:
    return tuple(layer for layer, _ in cfg.schedule)


def test_paper_schedule_l8_span_2_6_r2() -> None:
    cfg = ModelConfig(n_layers=8, loop_start=2, loop_end=6, n_loops=2)
    assert _layers(cfg) == (0, 1, 2, 3, 4, 5, 2, 3, 4, 5, 6, 7)
    assert cfg.schedule == (
        (0, 0),
        (1, 0),
        (2, 0),
        (3, 0),
        (4, 0),
        (5, 0),
        (2, 1),
        (3, 1),
        (4, 1),
        (5, 1),
        (6, 0),
        (7, 0),
    )
    assert cfg.effective_depth == 12
    assert cfg.looped_layers == (2, 3, 4, 5)
    assert [cfg.visits_of(i) for i in range(8)] == [1, 1, 2, 2, 2, 2, 1, 1]
    assert [cfg.residual_scale(i) for i in range(8)] == [1, 1, 0.5, 0.5, 0.5, 0.5, 1, 1]
    assert ModelConfig.smelt(n_layers=8) == cfg  # the recipe: L/4 .. 3L/4 - 1


def test_schedule_r3() -> None:
    cfg = ModelConfig(n_layers=8, loop_start=2, loop_end=6, n_loops=3)
    assert cfg.schedule == (
        (0, 0),
        (1, 0),
        (2, 0),
        (3, 0),
        (4, 0),
        (5, 0),
        (2, 1),
        (3, 1),
        (4, 1),
        (5, 1),
        (2, 2),
        (3, 2),
        (4, 2),
        (5, 2),
        (6, 0),
        (7, 0),
    )
    assert cfg.effective_depth == 16
    assert cfg.residual_scale(3) == pytest.approx(1 / 3)


def test_schedule_full_stack_loop() -> None:
    cfg = ModelConfig(n_layers=4, loop_start=0, loop_end=4, n_loops=2)
    assert cfg.schedule == ((0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (2, 1), (3, 1))
    assert all(cfg.visits_of(i) == 2 for i in range(4))


def test_schedule_other_span() -> None:
    cfg = ModelConfig(n_layers=6, loop_start=1, loop_end=2, n_loops=4)
    assert _layers(cfg) == (0, 1, 1, 1, 1, 2, 3, 4, 5)
    assert [v for layer, v in cfg.schedule if layer == 1] == [0, 1, 2, 3]


@pytest.mark.parametrize("fields", [{"n_loops": 1}, {"loop_start": 2, "loop_end": 2}])
def test_unlooped_variants_are_baselines(fields: dict[str, Any]) -> None:
    cfg = ModelConfig(n_layers=4, **{"loop_start": 1, "loop_end": 3, **fields})
    assert not cfg.is_looped
    assert cfg.schedule == ((0, 0), (1, 0), (2, 0), (3, 0))
    assert cfg.residual_scale(1) == 1.0


def test_constructors() -> None:
    base = ModelConfig.baseline(n_layers=8, loop_start=2, loop_end=6, n_loops=2)
    assert not base.is_looped and base.name == "baseline"
    smelt = ModelConfig.smelt(n_layers=8, n_loops=3)
    assert (smelt.loop_start, smelt.loop_end, smelt.n_loops) == (2, 6, 3)
    with pytest.raises(ConfigError, match="n_loops"):
        ModelConfig.smelt(n_loops=1)
    with pytest.raises(ConfigError, match="span"):
        ModelConfig.smelt(n_layers=1)


def test_dict_round_trip_and_unknown_field() -> None:
    cfg = ModelConfig.smelt(n_layers=8, d_model=64)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="d_modle"):
        ModelConfig.from_dict({**cfg.to_dict(), "d_modle": 3})
    with pytest.raises(ConfigError):
        ModelConfig.from_dict([1, 2])  # type: ignore[arg-type]


def test_loop_text_names_the_span_and_count() -> None:
    assert ModelConfig(n_layers=8, loop_start=2, loop_end=6, n_loops=3).loop_text == (
        "layers 2..5 x 3"
    )
    assert ModelConfig(n_layers=8).loop_text == "none"
