"""nnsight interventions against the same edits made with TransformerLens hooks
(`model.run_with_hooks`)."""

from __future__ import annotations

import pytest
import torch

from smelt_interp import hook_name
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.errors import ProbeError
from smelt_interp.measure.attention_stats import without_bos
from smelt_interp.probes.interventions import clean_run, patch_visit, run_without_bos_attention


@pytest.fixture
def model(make_cfg, make_model):
    return make_model(make_cfg(init_std=0.3), seed=7)


@pytest.fixture
def batch(make_tokens):
    tokens = make_tokens(2, 20, seed=7)
    tokens[1, 12:] = PAD_ID
    return tokens, torch.tensor([20, 12])


def test_without_bos_renormalises_rows():
    p = torch.softmax(
        torch.randn(2, 3, 5, 5).masked_fill(torch.ones(5, 5).triu(1).bool(), float("-inf")), -1
    )
    q = without_bos(p)
    assert torch.equal(q[..., 0, :], p[..., 0, :])  # query 0 sees only BOS: unchanged
    assert torch.all(q[..., 1:, 0] == 0)
    assert torch.allclose(q.sum(-1), torch.ones(2, 3, 5))
    assert torch.allclose(q[..., 1:, 1:], p[..., 1:, 1:] / (1 - p[..., 1:, :1]))


def test_bos_removal_equals_a_transformer_lens_hook(model, batch):
    tokens, lengths = batch
    layer, visit = 2, 1
    edited = run_without_bos_attention(model, tokens, layer, visit, lengths)
    with torch.no_grad():
        ref = model.run_with_hooks(
            tokens,
            fwd_hooks=[
                (hook_name(layer, visit, "attn.hook_pattern"), lambda p, hook: without_bos(p))
            ],
        )
    assert torch.allclose(edited.logits, ref, atol=1e-5)
    clean = clean_run(model, tokens, lengths)
    assert not torch.allclose(edited.logits, clean.logits, atol=1e-3)  # the edit did something
    assert torch.isfinite(edited.logits).all() and edited.loss != pytest.approx(clean.loss)


@pytest.mark.parametrize("hook", ["hook_resid_post", "attn.hook_v"])
def test_patch_visit_equals_a_transformer_lens_hook(model, batch, hook):
    tokens, lengths = batch
    layer = 1
    saved = {}

    def keep(act, hook):
        saved["src"] = act.clone()

    def swap(act, hook):
        return saved["src"]

    patched = patch_visit(model, tokens, layer, 0, 1, hook=hook, lengths=lengths)
    with torch.no_grad():
        ref = model.run_with_hooks(
            tokens, fwd_hooks=[(hook_name(layer, 0, hook), keep), (hook_name(layer, 1, hook), swap)]
        )
    assert torch.allclose(patched.logits, ref, atol=1e-5)
    assert not torch.allclose(patched.logits, clean_run(model, tokens).logits, atol=1e-3)


def test_answer_metrics_and_bad_arguments(model, batch):
    tokens, lengths = batch
    res = patch_visit(model, tokens, 2, lengths=lengths, answer_spans=[(15, 18), (8, 12)])
    assert 0 <= res.answer_token_acc <= 1 and res.answer_exact in (0.0, 0.5, 1.0)
    with pytest.raises(ProbeError, match="does not exist"):
        run_without_bos_attention(model, tokens, 0, 1)
    with pytest.raises(ProbeError, match="earlier visit"):
        patch_visit(model, tokens, 1, 1, 0)
    with pytest.raises(ProbeError, match="unknown hook"):
        patch_visit(model, tokens, 1, hook="resid")
