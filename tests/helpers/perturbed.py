"""Tiny models whose norms are off their init (gains 1, biases 0), so a test of the final norm's
folded gain and bias can fail; one case per architecture and norm kind."""

from __future__ import annotations

import pytest
import torch

from smelt_interp.model.transformer import SmeltModel

# (looped, norm) for the make_cfg fixture, and their test ids
NORM_CASES = [(True, "rms"), (False, "rms"), (True, "layer"), (False, "layer")]
NORM_CASE_IDS = ["smelt-rms", "baseline-rms", "smelt-layernorm", "baseline-layernorm"]


def perturbed(model: SmeltModel, seed: int = 1) -> SmeltModel:
    """`model` with 0.3-sized noise added to every 1-D parameter (the norms' gains and biases)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(name="model", params=NORM_CASES, ids=NORM_CASE_IDS)
def norm_case_model(request, make_cfg, make_model) -> SmeltModel:
    """`model`: one perturbed tiny model per NORM_CASES entry, for a test module that imports
    this fixture."""
    looped, norm = request.param
    return perturbed(make_model(make_cfg(looped=looped, norm=norm)))
