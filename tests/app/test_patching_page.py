"""The Patching page: URL state, the heatmap of every (layer, visit) and head as
measure.patching computes it, the user's own pair, and a bad pair as a message."""

from __future__ import annotations

import numpy as np
import pytest

from smelt_interp.app.pages import patching as page
from smelt_interp.app.registry import ModelRegistry
from smelt_interp.app.served import Served
from smelt_interp.app.urls import decode, encode
from smelt_interp.data.patch_pairs import user_pair
from smelt_interp.data.tokenizer import ByteTokenizer
from smelt_interp.measure.patching import activation_patching, nodes_of


@pytest.fixture
def models(make_cfg, make_model):
    return {
        "baseline": make_model(make_cfg(looped=False, max_seq_len=128)),
        "smelt": make_model(make_cfg(looped=True, max_seq_len=128), seed=1),
    }


@pytest.fixture
def wb(models) -> Served:
    return Served(ModelRegistry.from_models(models))


def test_url_state_round_trips_and_bad_values_fall_back(wb) -> None:
    state = {
        "model": "smelt", "pair": "own", "metric": "loss", "site": "v", "column": "attribution",
        "clean": "( [ ( Output:", "corrupt": "( [ [ Output:",
    }  # fmt: skip
    assert decode(page.QUERY, encode(page.QUERY, state)) == state
    s = page.resolve(wb, {"model": "nope", "pair": "x", "metric": 3, "site": "mlp_out"})
    assert (s["pair"], s["metric"], s["site"], s["column"]) == (
        "task", "logit_diff", "z", "activation"
    )  # fmt: skip


def test_the_heatmap_holds_every_heads_activation_patching_effect(wb, models) -> None:
    clean, corrupt = "Input: ( [ ( Output:", "Input: ( [ [ Output:"
    heat, scatter, info, _, style = page.figures(
        wb, "smelt", "own", "logit_diff", "z", "activation", clean, corrupt
    )
    assert style == {"display": "none"} and "Pearson" in info
    model = models["smelt"]
    ids = [ByteTokenizer().encode(t) for t in (clean, corrupt)]
    expected = activation_patching(model, user_pair(*ids), nodes_of(model, "z", per_head=True))
    grid = np.array(heat.data[0].z, dtype=float)
    assert grid.shape == (len(model.schedule), model.cfg.n_heads)
    # rows in execution order: (0,0), (1,0), (2,0), (1,1), (2,1), (3,0)
    assert list(heat.data[0].y)[3] == "layer 1 · visit 1"
    np.testing.assert_allclose(grid.ravel(), expected["effect"].to_numpy(), atol=1e-9)
    assert len(scatter.data[1].x) == grid.size


def test_the_task_pair_draws_and_an_unequal_pair_is_a_message(wb) -> None:
    heat, *_, style = page.figures(wb, "smelt", "task", "logit_diff", "k", "attribution", "", "")
    assert style == {"display": "none"}
    assert np.array(heat.data[0].z, dtype=float).shape[1] == 2  # key/value heads
    *_, msg, style = page.figures(wb, "smelt", "own", "logit_diff", "z", "activation", "(", "((")
    assert style == {"display": "block"} and "equal lengths" in msg


def test_over_the_page_cost_the_page_draws_attribution_alone(wb, models, monkeypatch) -> None:
    """A model whose activation patching would cost more than PAGE_COST (a real LM on a CPU)
    gets the attribution heatmap, the same numbers the full table holds, and a note naming the
    command instead of the scatter."""
    clean, corrupt = "Input: ( [ ( Output:", "Input: ( [ [ Output:"
    full, *_ = page.figures(wb, "smelt", "own", "logit_diff", "z", "attribution", clean, corrupt)
    monkeypatch.setattr(page, "PAGE_COST", 0.0)
    heat, scatter, info, _, style = page.figures(
        wb, "smelt", "own", "logit_diff", "z", "activation", clean, corrupt
    )
    assert style == {"display": "none"} and "Pearson" not in info and "attribution" in info
    assert heat.layout.title.text.endswith("· attribution")
    np.testing.assert_allclose(
        np.array(heat.data[0].z, dtype=float), np.array(full.data[0].z, dtype=float), atol=1e-12
    )
    assert "python -m smelt_interp.probes.patching" in scatter.layout.annotations[0].text


def test_the_page_counts_the_sites_own_heads(wb, models, monkeypatch) -> None:
    """K is patched per key/value head: the note names that many nodes, not the query heads."""
    monkeypatch.setattr(page, "PAGE_COST", 0.0)
    _, scatter, *_ = page.figures(wb, "smelt", "task", "logit_diff", "k", "activation", "", "")
    model = models["smelt"]
    n_kv = len(model.schedule) * model.cfg.n_kv_heads
    assert f"Activation patching of {n_kv} k heads" in scatter.layout.annotations[0].text
