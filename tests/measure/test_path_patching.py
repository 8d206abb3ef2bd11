"""Path patching, cross-visit patching and the nnsight route (measure.path_patching), against the
hand-built relay (visit 1 of a head reading visit 0's write), the existing visit swap
(probes.interventions.patch_visit) and hook-call counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.hand_built import ANSWER, RELAY, HandBuilt

from smelt_interp.data.patch_pairs import PromptPair, user_pair
from smelt_interp.errors import ProbeError
from smelt_interp.measure.patching import (
    Node,
    activation_patching,
    cached,
    nodes_of,
    patch_edits,
    run_edited,
    scores,
)
from smelt_interp.measure.path_patching import (
    cross_visit_patching,
    nnsight_patched_logits,
    path_patching,
)
from smelt_interp.model.protocol import VISIT_HOOKS
from smelt_interp.probes.interventions import patch_visit

PAIR = user_pair([0, 1, 2, 3, 4, 2], [0, 5, 2, 3, 4, 2], clean_answer=1, corrupt_answer=5)


def _pair(model, rows: int = 2, length: int = 10) -> PromptPair:
    gen = torch.Generator().manual_seed(1)
    clean = torch.randint(0, 256, (rows, length), generator=gen)
    clean[:, 0] = model.cfg.bos_token_id
    corrupt = clean.clone()
    corrupt[:, 2] = (clean[:, 2] + 11) % 256
    return PromptPair(clean, corrupt, torch.full((rows,), length - 1), clean[:, 2], corrupt[:, 2])


def test_path_from_visit_0_to_visit_1_of_the_relay() -> None:
    model = HandBuilt(uniform=True, relay=True)
    senders = [n for n in nodes_of(model, "z", per_head=True) if (n.layer, n.visit) < (1, 1)]
    senders = [n for n in senders if (n.layer, n.visit) != (1, 1)][:4]
    to_v = path_patching(model, PAIR, senders, Node(*ANSWER[:2], "v", ANSWER[2]))
    effect = {(r.layer, r.visit, r.head): r.effect for r in to_v.itertuples()}
    assert effect.pop(RELAY) == pytest.approx(1.0, abs=1e-9)
    assert max(abs(v) for v in effect.values()) < 1e-9
    # the answer head's query reads nothing (uniform attention): no path through it
    to_q = path_patching(model, PAIR, senders, Node(*ANSWER[:2], "q", ANSWER[2]))
    assert np.abs(to_q["effect"]).max() < 1e-9
    # a head of the same visit that reads the relay's write but writes only junk
    to_other = path_patching(model, PAIR, senders, Node(1, 1, "v", 1))
    assert np.abs(to_other["effect"]).max() < 1e-9


def test_path_patching_with_the_receiver_the_only_route_equals_activation_patching() -> None:
    # In the relay, the relay's write reaches the answer only through the answer head's v:
    # the path effect equals the sender's whole activation-patching effect.
    model = HandBuilt(uniform=False, relay=True)
    sender = Node(*RELAY[:2], "z", RELAY[2])
    path = path_patching(model, PAIR, [sender], Node(*ANSWER[:2], "v", ANSWER[2]))
    whole = activation_patching(model, PAIR, [sender])
    assert path["effect"].iloc[0] == pytest.approx(whole["effect"].iloc[0], abs=1e-9)
    assert abs(whole["effect"].iloc[0]) > 0.1


def test_path_patching_refuses_backward_paths(tiny_model) -> None:
    pair = _pair(tiny_model)
    with pytest.raises(ProbeError, match="does not run before"):
        path_patching(tiny_model, pair, [Node(2, 1, "z", 0)], Node(1, 1, "q", 0))
    with pytest.raises(ProbeError, match="receiver must be"):
        path_patching(tiny_model, pair, [Node(0, 0, "z", 0)], Node(1, 1, "z", 0))


def test_path_patching_runs_on_a_smelt_model_with_batched_senders(tiny_model) -> None:
    pair = _pair(tiny_model)
    receiver = Node(1, 1, "k", 1)
    senders = [
        n
        for n in nodes_of(tiny_model, "z", per_head=True)
        if (n.layer, n.visit) in {(0, 0), (1, 0)} and n.head < 3
    ]
    batched = path_patching(tiny_model, pair, senders, receiver, batch=5)
    single = path_patching(tiny_model, pair, senders, receiver, batch=1)
    np.testing.assert_allclose(batched["effect"], single["effect"], atol=1e-6)
    frozen = path_patching(tiny_model, pair, senders, receiver, freeze_mlp=True)
    assert np.isfinite(frozen["effect"]).all()


@pytest.mark.parametrize("hook", ["attn.hook_z", "hook_resid_post", "hook_mlp_out"])
def test_cross_visit_matches_the_visit_swap_of_the_interventions(tiny_model, hook: str) -> None:
    pair = _pair(tiny_model)
    site = {"attn.hook_z": "z", "hook_resid_post": "resid_post", "hook_mlp_out": "mlp_out"}[hook]
    table = cross_visit_patching(tiny_model, pair, site, per_head=False)
    clean_logits, _ = cached(tiny_model, pair.clean, [])
    corrupt_logits, _ = cached(tiny_model, pair.corrupt, [])
    k, c = (float(scores(x, pair, "logit_diff")[0]) for x in (clean_logits, corrupt_logits))
    for layer in tiny_model.cfg.looped_layers:
        swapped = patch_visit(tiny_model, pair.clean, layer, 0, 1, hook).logits
        expected = (float(scores(swapped, pair, "logit_diff")[0]) - c) / (k - c)
        row = table[(table["layer"] == layer) & (table["visit"] == 1)]
        assert row["source_visit"].tolist() == [0]
        assert row["effect"].iloc[0] == pytest.approx(expected, abs=1e-5)
    # the reverse: visit 0 given visit 1's activation (from the unedited run)
    assert set(zip(table["visit"], table["source_visit"])) == {(0, 1), (1, 0)}


def test_cross_visit_per_head_on_the_hand_built_model() -> None:
    model = HandBuilt(uniform=True, relay=True)
    table = cross_visit_patching(model, PAIR, "z", per_head=True)
    row = table[(table["visit"] == 1) & (table["head"] == 0)]
    # visit 1's answer head given visit 0's z (which holds the token average, not the relay's)
    z0 = cached(model, PAIR.clean, ["blocks.1.visits.0.attn.hook_z"])[1]
    edits = patch_edits([Node(1, 1, "z", 0)], ["blocks.1.visits.0.attn.hook_z"], z0)
    logits, _ = run_edited(model, PAIR.clean, 1, edits)
    full = activation_patching(model, PAIR, [Node(1, 1, "z", 0)])
    expected = (float(scores(logits, PAIR, "logit_diff")[0]) - full.attrs["corrupt"]) / (
        full.attrs["clean"] - full.attrs["corrupt"]
    )
    assert row["effect"].iloc[0] == pytest.approx(expected, abs=1e-9)


def _count_calls(model) -> tuple[dict[str, int], list]:
    counts: dict[str, int] = {}
    handles = []
    for name, module in model.named_modules():
        if any(name.endswith(h) for h in VISIT_HOOKS):
            counts[name] = 0

            def bump(mod, args, out, name=name):
                counts[name] += 1

            handles.append(module.register_forward_hook(bump))
    return counts, handles


def test_a_patched_hook_fires_once_per_forward_on_transformer_lens_and_nnsight(tiny_model):
    pair = _pair(tiny_model)
    node = Node(1, 1, "z", 2, position=4)
    _, acts = cached(tiny_model, pair.clean, [node.hook])
    counts, handles = _count_calls(tiny_model)
    try:
        edits = patch_edits([node], [node.hook], acts)
        tl_logits, _ = run_edited(tiny_model, pair.corrupt, 1, edits)
        assert set(counts.values()) == {1}
        assert len(counts) == len(tiny_model.schedule) * len(VISIT_HOOKS)
        for name in counts:
            counts[name] = 0
        nn_logits = nnsight_patched_logits(tiny_model, pair.corrupt, node, acts[node.hook])
        fired = {k: v for k, v in counts.items() if "hook_pattern" not in k}
        assert set(fired.values()) == {1}
    finally:
        for handle in handles:
            handle.remove()
    assert torch.allclose(nn_logits, tl_logits, atol=1e-6)
    plain, _ = cached(tiny_model, pair.corrupt, [])
    assert not torch.allclose(plain, tl_logits, atol=1e-6)  # the edit took
