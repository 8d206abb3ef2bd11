"""Patching on transformers' looped models through the adapter: a node patched with its own
clean value changes nothing, each hook fires once per forward pass, batched copies match one
forward per node, and attribution patching's gradients reach the adapter's hook points."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from helpers.tiny_looped import VOCAB, tiny_model  # noqa: E402

from smelt_interp.adapters import adapt  # noqa: E402
from smelt_interp.data.patch_pairs import PromptPair  # noqa: E402
from smelt_interp.measure.patching import (  # noqa: E402
    activation_patching,
    attribution_patching,
    cached,
    node_mask,
    nodes_of,
    patch_edits,
    run_edited,
    scores,
)
from smelt_interp.measure.path_patching import nnsight_patched_logits  # noqa: E402
from smelt_interp.model.protocol import VISIT_HOOKS  # noqa: E402


@pytest.fixture(scope="module", params=["hrm_text", "dory"])
def adapted(request):
    return adapt(tiny_model(request.param)).eval()


def _pair(rows: int = 2, length: int = 10) -> PromptPair:
    gen = torch.Generator().manual_seed(3)
    clean = torch.randint(1, VOCAB, (rows, length), generator=gen)
    corrupt = clean.clone()
    corrupt[:, 2] = clean[:, 2] % (VOCAB - 1) + 1
    return PromptPair(clean, corrupt, torch.full((rows,), length - 1), clean[:, 2], corrupt[:, 2])


def test_self_patch_changes_nothing_and_batches_match_single_nodes(adapted) -> None:
    pair = _pair()
    nodes = [*nodes_of(adapted, "z", per_head=True), *nodes_of(adapted, "mlp_out")]
    clean_logits, acts = cached(adapted, pair.clean, [n.hook for n in nodes])
    logits, _ = run_edited(
        adapted, pair.clean, len(nodes), patch_edits(nodes, [n.hook for n in nodes], acts)
    )
    assert torch.allclose(logits, clean_logits.repeat(len(nodes), 1, 1), atol=1e-6, rtol=0)
    batched = activation_patching(adapted, pair, nodes, batch=8)
    single = activation_patching(adapted, pair, nodes, batch=1)
    np.testing.assert_allclose(batched["effect"], single["effect"], atol=1e-5)
    assert np.abs(batched["effect"]).max() > 0.01  # the edits took


@pytest.mark.parametrize("site", ["z", "attn_out", "mlp_out", "resid_post"])
def test_attribution_is_the_derivative_along_clean_minus_corrupted(adapted, site) -> None:
    """Per node, d metric / dt with the node set to corrupted + t (clean - corrupted), at t = 0,
    from its own backward pass through a plain hook, against attribution patching's estimate
    of all nodes from one: the gradient reaches the adapter's hook points (where it did not,
    every estimate would be 0)."""
    pair = _pair()
    nodes = nodes_of(adapted, site, per_head=site == "z")[::3]
    estimate = attribution_patching(adapted, pair, nodes)["estimate"].to_numpy()
    names = [n.hook for n in nodes]
    _, clean = cached(adapted, pair.clean, names)
    _, corrupt = cached(adapted, pair.corrupt, names)
    slopes = []
    for node in nodes:  # NaN where no backward pass reaches the node (HRM's early cycles)
        t = torch.zeros((), requires_grad=True)
        mask = node_mask([node], clean[node.hook].shape)[0]
        delta = clean[node.hook] - corrupt[node.hook]

        def move(act, hook=None, mask=mask, delta=delta, t=t):
            return torch.where(mask, act + t * delta, act)

        with torch.enable_grad():
            logits = adapted.run_with_hooks(pair.corrupt, fwd_hooks=[(node.hook, move)])
            metric = scores(logits, pair, "logit_diff")[0]
            (grad,) = torch.autograd.grad(metric, [t], allow_unused=True)
        slopes.append(np.nan if grad is None else float(grad))
    reached = np.isfinite(estimate)
    assert reached.any() and np.abs(estimate[reached]).max() > 0
    scale = np.abs(estimate[reached]).max()
    np.testing.assert_allclose(slopes, estimate, rtol=1e-4, atol=1e-4 * scale, equal_nan=True)


def test_a_patched_hook_fires_once_per_forward_on_both_libraries(adapted) -> None:
    pair = _pair()
    node = nodes_of(adapted, "z", per_head=True)[-1]
    _, acts = cached(adapted, pair.clean, [node.hook])
    counts, handles = {}, []
    for name, module in adapted.named_modules():
        if name.startswith("blocks.") and any(name.endswith(h) for h in VISIT_HOOKS):
            counts[name] = 0
            handles.append(module.register_forward_hook(
                lambda m, a, o, name=name: counts.__setitem__(name, counts[name] + 1)))  # fmt: skip
    try:
        tl, _ = run_edited(adapted, pair.corrupt, 1, patch_edits([node], [node.hook], acts))
        fired = [counts[n] for n in counts if counts[n]]
        assert fired and set(fired) == {1} and counts[node.hook] == 1
        for name in counts:
            counts[name] = 0
        nn = nnsight_patched_logits(adapted, pair.corrupt, node, acts[node.hook])
        assert counts[node.hook] == 1 and set(v for v in counts.values() if v) == {1}
    finally:
        for handle in handles:
            handle.remove()
    assert torch.allclose(nn, tl, atol=1e-5)
