"""The direct-logit-attribution probe: one head's value against a float64 loop over positions
from the raw weights, every visit's attention and MoE values against TransformerLens's
logit_attrs over the depth aliases, and the parts (embedding, heads, MoE writes, norm bias)
summing to the model's own next-token logit, on SMELT and Baseline models."""

from __future__ import annotations

import pytest
import torch
from helpers.perturbed import norm_case_model  # noqa: F401 (the `model` fixture)

from smelt_interp.errors import ProbeError
from smelt_interp.figures.probes import probe_figures
from smelt_interp.measure.batching import capture
from smelt_interp.measure.depth_cache import run_with_depth_cache
from smelt_interp.model.protocol import hook_name
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes import dla
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import ProbeOptions, get

LENGTHS = [12, 8]


@pytest.fixture
def tokens(make_tokens) -> torch.Tensor:
    return make_tokens(2, 12)


def slow_head_dla(
    model: SmeltModel, tokens: torch.Tensor, layer: int, visit: int, head: int
) -> float:
    """One head's DLA, position by position in float64, from the model's raw weights: its
    write scale * W_o[:, head] z, through the final norm frozen at that position (gain, and
    centring for LayerNorm), dotted with the unembedding row of the next token."""
    cfg = model.cfg
    z_name = hook_name(layer, visit, "attn.hook_z")
    final_name = hook_name(*model.schedule[-1], "hook_resid_post")
    _, cache = capture(model, tokens, [z_name, final_name])
    cols = slice(head * cfg.d_head, (head + 1) * cfg.d_head)
    W_o = model.blocks[layer].attn.W_o.weight.detach().double()[:, cols]
    gain = model.ln_final.weight.detach().double()
    scale = 1.0 / cfg.visits_of(layer)
    total, count = 0.0, 0
    for b, length in enumerate(LENGTHS):
        for t in range(length - 1):
            write = scale * (W_o @ cache[z_name][b, t, head].double())
            resid = cache[final_name][b, t].double()
            if cfg.norm == "layer":
                write, resid = write - write.mean(), resid - resid.mean()
            frozen = (resid.pow(2).mean() + cfg.norm_eps).sqrt()
            row = model.unembed.weight[tokens[b, t + 1]].detach().double()
            total += float((gain * write / frozen) @ row)
            count += 1
    return total / count


def test_one_heads_dla_matches_a_float64_loop(model, tokens):
    layer, visit = model.schedule[-3]  # in the loop's second pass on the SMELT model
    tables = dla.measure(model, tokens, LENGTHS, batch_size=1)
    heads = tables["heads"].set_index(["layer", "visit", "head"])["dla"]
    for head in (0, model.cfg.n_heads - 1):
        want = slow_head_dla(model, tokens, layer, visit, head)
        # the probe folds the norm's gain into W_U in float32: a 1e-7 relative rounding
        assert heads[layer, visit, head] == pytest.approx(want, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("against", [None, "mean", 5])
def test_the_parts_sum_to_the_models_logit(model, tokens, against):
    parts = dla.measure(model, tokens, LENGTHS, against=against)["parts"]
    parts = parts.set_index("part")["dla"]
    assert list(parts.index) == list(dla.PARTS)
    assert parts["total"] == pytest.approx(parts["logit"], abs=1e-4)
    assert parts[["embed", "attn", "mlp", "bias"]].sum() == pytest.approx(parts["total"])
    if model.cfg.norm == "rms":  # only a LayerNorm's bias reaches the logits
        assert parts["bias"] == 0.0


def test_each_visit_matches_transformer_lens_logit_attrs(model, tokens):
    """Attention and MoE rows against TL's logit_attrs of decompose_resid over the aliases,
    averaged over the same positions (the TL stack's bias-free components)."""
    tables = dla.measure(model, tokens, LENGTHS, batch_size=1)
    _, cache = run_with_depth_cache(model, tokens, heads=False)
    parts, labels = cache.decompose_resid(pos_slice=slice(0, -1), return_labels=True)
    attrs = cache.logit_attrs(parts, tokens[:, 1:], pos_slice=slice(0, -1)).double()
    valid = torch.arange(11)[None, :] < torch.tensor(LENGTHS)[:, None] - 1
    means = dict(zip(labels, (attrs[:, valid].sum(-1) / valid.sum()).tolist()))
    visits = tables["visits"]
    assert list(visits["depth"]) == list(range(len(model.schedule)))
    for row in visits.itertuples():
        assert row.attn_dla == pytest.approx(means[f"{row.depth}_attn_out"], abs=1e-5)
        assert row.mlp_dla == pytest.approx(means[f"{row.depth}_mlp_out"], abs=1e-5)
    embed = tables["parts"].set_index("part")["dla"]["embed"]
    assert embed == pytest.approx(means["embed"], abs=1e-5)


def test_heads_sum_to_their_visits_attention(tiny_model, make_tokens):
    tables = dla.measure(tiny_model, make_tokens(3, 10))
    heads, visits = tables["heads"], tables["visits"]
    assert list(heads.columns) == ["layer", "visit", "head", "depth", "dla"]
    assert list(visits.columns) == ["layer", "visit", "depth", "attn_dla", "mlp_dla"]
    assert len(heads) == len(tiny_model.schedule) * tiny_model.cfg.n_heads
    summed = heads.groupby(["layer", "visit"], sort=False)["dla"].sum().to_numpy()
    assert summed == pytest.approx(visits["attn_dla"].to_numpy())


def test_a_bad_against_is_one_line(tiny_model, make_tokens):
    for against in (-1, 10_000, "max"):
        with pytest.raises(ProbeError, match="against must be None, 'mean' or a token id"):
            dla.measure(tiny_model, make_tokens(1, 6), against=against)


def test_the_registered_probe_runs_summarises_and_draws(tiny_model):
    spec = get("dla")
    assert spec is dla.PROBE
    cfg = tiny_model.cfg
    inputs = ProbeInputs(n_seqs=2, seq_len=32, demos=(0,), max_seq_len=cfg.max_seq_len)
    tables = spec.run(tiny_model, inputs, ProbeOptions())
    assert set(tables) == set(spec.tables)
    stats = spec.summarize(tables).set_index("statistic")["value"]
    logit, total = stats["next-token logit (the model's)"], stats["sum of the direct attributions"]
    assert total == pytest.approx(logit, abs=1e-4)
    assert "attention, loop span, visit 1" in stats.index
    figures = probe_figures(spec, {"smelt": tables})
    assert [f.layout.title.text for f in figures] == [f.title for f in spec.figures]
