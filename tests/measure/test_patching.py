"""Activation and attribution patching (measure.patching) against a hand-built model whose
circuit is known, a node-by-node reference loop, and the unedited run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.hand_built import ANSWER, HandBuilt

from smelt_interp.data.patch_pairs import PromptPair, user_pair
from smelt_interp.errors import ProbeError
from smelt_interp.measure.patching import (
    Node,
    activation_patching,
    attribution_patching,
    cached,
    correlation,
    nodes_of,
    patch_edits,
    run_edited,
    scores,
)

# the key at position 1 changes; the answer head's average over the row carries it
PAIR = user_pair([0, 1, 2, 3, 4, 2], [0, 5, 2, 3, 4, 2], clean_answer=1, corrupt_answer=5)


def _tiny_pair(model, seed: int = 0, rows: int = 3, length: int = 12) -> PromptPair:
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, 256, (rows, length), generator=gen)
    clean[:, 0] = model.cfg.bos_token_id
    corrupt = clean.clone()
    corrupt[:, 3] = (clean[:, 3] + 7) % 256
    last = torch.full((rows,), length - 1)
    return PromptPair(clean, corrupt, last, clean[:, 3], corrupt[:, 3])


@pytest.mark.parametrize("uniform", [True, False])
def test_finds_the_one_head_that_carries_the_answer(uniform: bool) -> None:
    model = HandBuilt(uniform=uniform)
    heads = activation_patching(model, PAIR, nodes_of(model, "z", per_head=True))
    found = heads[heads["effect"].abs() > 1e-9]
    assert [tuple(r) for r in found[["layer", "visit", "head"]].to_numpy()] == [ANSWER]
    assert found["effect"].iloc[0] == pytest.approx(1.0, abs=1e-9)
    # by position: only the scored position of that head
    by_pos = activation_patching(
        model, PAIR, nodes_of(model, "z", per_head=True, per_position=True, length=6)
    )
    hit = by_pos[by_pos["effect"].abs() > 1e-9]
    assert [tuple(r) for r in hit[["layer", "visit", "head", "position"]].to_numpy()] == [
        (*ANSWER, 5)
    ]
    visits = activation_patching(model, PAIR, nodes_of(model, "attn_out"))
    assert visits["effect"].round(9).tolist() == [0.0, 0.0, 1.0, 0.0]
    assert (
        np.abs(activation_patching(model, PAIR, nodes_of(model, "mlp_out"))["effect"]).max() < 1e-9
    )


SITES = [
    ("z", dict(per_head=True)),
    ("v", dict(per_head=True)),
    ("attn_out", {}),
    ("mlp_out", {}),
    ("resid_pre", dict(per_position=True, length=6)),
    ("resid_post", dict(per_position=True, length=6)),
]


@pytest.mark.parametrize("site,kw", SITES)
def test_attribution_equals_activation_where_the_model_is_linear(site: str, kw: dict) -> None:
    # uniform patterns: linear in every node
    model = HandBuilt(uniform=True, relay=True, mlp_answer=True)
    nodes = nodes_of(model, site, **kw)
    act = activation_patching(model, PAIR, nodes)
    attr = attribution_patching(model, PAIR, nodes)
    assert np.abs(act["effect"] - attr["effect"]).max() < 1e-6
    assert np.abs(act["effect"]).max() > 0.1  # something moved


def test_attribution_is_only_first_order_where_attention_reads_the_node() -> None:
    model = HandBuilt(uniform=False)  # patterns depend on the tokens: second-order terms
    nodes = nodes_of(model, "resid_pre", per_position=True, length=6)
    act = activation_patching(model, PAIR, nodes)
    attr = attribution_patching(model, PAIR, nodes)
    assert np.abs(act["effect"] - attr["effect"]).max() > 1e-3
    stats = correlation(act, attr)
    assert -1.0 <= stats["pearson"] <= 1.0 and stats["nodes"] == len(nodes)


def _reference_effects(model, pair: PromptPair, nodes: list[Node]) -> list[float]:
    """One forward per node with a plain hook: the slow loop the batched runner must match."""
    clean_logits, acts = cached(model, pair.clean, list({n.hook for n in nodes}))
    corrupt_logits, _ = cached(model, pair.corrupt, [])
    k, c = (float(scores(x, pair, "logit_diff")[0]) for x in (clean_logits, corrupt_logits))
    out = []
    for node in nodes:
        source = acts[node.hook]

        def hook(act, hook=None, node=node, source=source):
            out = act.clone()
            pos = slice(None) if node.position is None else node.position
            if node.head is None:
                out[:, pos] = source[:, pos]
            else:
                out[:, pos, node.head] = source[:, pos, node.head]
            return out

        with torch.no_grad():
            logits = model.run_with_hooks(pair.corrupt, fwd_hooks=[(node.hook, hook)])
        out.append((float(scores(logits, pair, "logit_diff")[0]) - c) / (k - c))
    return out


@pytest.mark.parametrize(
    "site,kw",
    [
        ("z", dict(per_head=True)),
        ("resid_mid", dict(per_position=True, length=8)),
        ("k", dict(per_head=True)),
    ],
)
def test_batched_copies_match_one_forward_per_node(tiny_model, site: str, kw: dict) -> None:
    pair = _tiny_pair(tiny_model, length=8)
    nodes = nodes_of(tiny_model, site, **kw)
    batched = activation_patching(tiny_model, pair, nodes, batch=7)
    expected = _reference_effects(tiny_model, pair, nodes)
    np.testing.assert_allclose(batched["effect"], expected, atol=1e-5)


def test_patching_a_node_with_its_own_clean_value_changes_nothing(tiny_model) -> None:
    pair = _tiny_pair(tiny_model)
    nodes = [
        *nodes_of(tiny_model, "z", per_head=True),
        *nodes_of(tiny_model, "resid_pre", per_position=True, length=12)[:5],
        *nodes_of(tiny_model, "mlp_out"),
        *nodes_of(tiny_model, "q", per_head=True)[:3],
    ]
    clean_logits, acts = cached(tiny_model, pair.clean, [n.hook for n in nodes])
    edits = patch_edits(nodes, [n.hook for n in nodes], acts)
    logits, _ = run_edited(tiny_model, pair.clean, len(nodes), edits)
    assert torch.allclose(logits, clean_logits.repeat(len(nodes), 1, 1), atol=1e-6, rtol=0)


def test_metrics_and_their_normalisation(tiny_model) -> None:
    pair = _tiny_pair(tiny_model)
    logits, _ = cached(tiny_model, pair.clean, [])
    at = logits[torch.arange(3), pair.position].double()
    diff = at.gather(1, pair.clean_answer[:, None]) - at.gather(1, pair.corrupt_answer[:, None])
    assert float(scores(logits, pair, "logit_diff")[0]) == pytest.approx(float(diff.mean()))
    ce = -torch.log_softmax(at, -1).gather(1, pair.clean_answer[:, None]).mean()
    assert float(scores(logits, pair, "loss")[0]) == pytest.approx(float(ce))
    frame = activation_patching(
        tiny_model, pair, nodes_of(tiny_model, "resid_pre")[:1], metric="loss"
    )
    # patching the whole residual stream before the first layer is the clean run
    assert frame["effect"].iloc[0] == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ProbeError, match="unknown metric"):
        scores(logits, pair, "accuracy")


def test_bad_nodes_are_one_line(tiny_model) -> None:
    pair = _tiny_pair(tiny_model)
    with pytest.raises(ProbeError, match="no visit 0.1"):
        activation_patching(tiny_model, pair, [Node(0, 1, "z", 0)])
    with pytest.raises(ProbeError, match="head 9"):
        activation_patching(tiny_model, pair, [Node(1, 1, "z", 9)])
    with pytest.raises(ProbeError, match="has no heads"):
        nodes_of(tiny_model, "attn_out", per_head=True)


def test_attribution_alone_is_the_full_tables_attribution(make_cfg, make_model) -> None:
    """side_by_side(activation=False): the same attribution column, activation NaN, the same
    clean and corrupted metrics; patching_cost counts nodes x rows x length x parameters."""
    from smelt_interp.data.patch_pairs import user_pair
    from smelt_interp.measure.patch_tables import patching_cost, side_by_side

    model = make_model(make_cfg(looped=True, max_seq_len=64), seed=2)
    pair = user_pair([1, 5, 9, 12, 3, 7], [1, 5, 9, 13, 3, 7])
    full = side_by_side(model, pair, "z", per_head=True)
    alone = side_by_side(model, pair, "z", per_head=True, activation=False)
    assert alone["activation"].isna().all() and full["activation"].notna().all()
    np.testing.assert_array_equal(alone["attribution"], full["attribution"])
    assert alone.attrs["clean"] == full.attrs["clean"]
    n_params = sum(p.numel() for p in model.parameters())
    assert patching_cost(model, pair, len(full)) == len(full) * 1 * 6 * n_params
