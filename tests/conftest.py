"""Shared, generic fixtures: tiny model configs, models and token batches (small enough that
a forward pass takes milliseconds on a shared CPU)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from smelt_interp.config import ModelConfig
from smelt_interp.model.transformer import SmeltModel

# One intra-op thread: on a shared CPU, torch's thread pool stalls tiny ops (~100x slower).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _keep_one_torch_thread():
    """Undo a test's torch.set_num_threads (the app's and the trainer's commands set it): a
    2-thread pool that spin-waits next to another busy process runs ~30x slower."""
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


# d_model and d_expert are multiples of 4, so the grouped_mm dispatch is taken in float32.
TINY_FIELDS: dict[str, Any] = dict(
    d_model=32,
    n_layers=4,
    n_heads=4,
    n_kv_heads=2,
    d_head=8,
    n_experts=4,
    top_k=2,
    d_expert=16,
    max_seq_len=64,
)


@pytest.fixture
def make_cfg() -> Callable[..., ModelConfig]:
    """Factory: `make_cfg(looped=True, **fields)` -> a tiny SMELT (or Baseline) config."""

    def make(looped: bool = True, **fields: Any) -> ModelConfig:
        merged = {**TINY_FIELDS, **fields}
        return ModelConfig.smelt(**merged) if looped else ModelConfig.baseline(**merged)

    return make


@pytest.fixture
def tiny_cfg(make_cfg: Callable[..., ModelConfig]) -> ModelConfig:
    """4 layers, layers 1..2 looped twice: schedule 0, 1, 2, 1, 2, 3."""
    return make_cfg()


@pytest.fixture
def make_model() -> Callable[..., SmeltModel]:
    """Factory: `make_model(cfg, seed=0)` -> a seeded SmeltModel in eval mode."""

    def make(cfg: ModelConfig, seed: int = 0) -> SmeltModel:
        torch.manual_seed(seed)
        return SmeltModel(cfg).eval()

    return make


@pytest.fixture
def tiny_model(tiny_cfg: ModelConfig, make_model: Callable[..., SmeltModel]) -> SmeltModel:
    return make_model(tiny_cfg)


@pytest.fixture
def make_tokens() -> Callable[..., torch.Tensor]:
    """Factory: `make_tokens(batch, pos, seed=0, cfg=None)` -> ids starting with BOS."""

    def make(batch: int, pos: int, seed: int = 0, cfg: ModelConfig | None = None) -> torch.Tensor:
        cfg = cfg or ModelConfig(**TINY_FIELDS)
        gen = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, 256, (batch, pos), generator=gen)
        tokens[:, 0] = cfg.bos_token_id
        return tokens

    return make


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A trained tiny Baseline/SMELT pair (preset dyck-pair-tiny, about a minute on 2 cores):
    {"baseline": .../baseline/ckpt.pt, "smelt": .../smelt/ckpt.pt}. Set SMELT_TINY_PAIR to a
    folder to reuse (or create once) a pair across local runs."""
    import os

    from smelt_interp.train.config import TrainConfig
    from smelt_interp.train.presets import get_preset
    from smelt_interp.train.trainer import train_pair

    root = Path(os.environ.get("SMELT_TINY_PAIR") or tmp_path_factory.mktemp("tiny_pair"))
    paths = {arch: root / arch / "ckpt.pt" for arch in ("baseline", "smelt")}
    if not all(p.exists() for p in paths.values()):
        train_pair(TrainConfig.from_dict(get_preset("dyck-pair-tiny")), root, progress=False)
    return paths


@pytest.hookimpl(optionalhook=True)
def pytest_setup_options():
    """dash[testing]'s hook: the Chrome options of `dash_duo` (headless Chromium, see
    tests/helpers/browser.py)."""
    from helpers.browser import chrome_options

    return chrome_options()
