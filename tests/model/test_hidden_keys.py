"""Hidden keys (ModelConfig.hidden_key_ids, hide_keys_from): the attention of layers from
`hide_keys_from` on cannot see the keys of the listed tokens, on every path (fused, explicit,
cached, compiled), and every measure that recomputes attention from cached Q and K applies the
same mask. The reference is a float64 loop over queries and keys, written from the definition:
softmax over the causally visible keys that are not hidden (position 0 never is)."""

from __future__ import annotations

import math

import pytest
import torch

from smelt_interp.app.pages import pattern_cap
from smelt_interp.app.prompt_run import run_prompt
from smelt_interp.app.registry import ModelRegistry
from smelt_interp.checkpoint import load_checkpoint, save_checkpoint
from smelt_interp.config import ModelConfig
from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_rows
from smelt_interp.errors import ConfigError
from smelt_interp.measure.attention_stats import topk_overlap_sum
from smelt_interp.measure.case_positions import MAX_DEMOS, recall_case
from smelt_interp.measure.position_mass import (
    attention_rows,
    grouped_mass,
    pattern_rows,
    qk_hook_names,
    visit_masses,
)
from smelt_interp.model.kv_cache import KVCache
from smelt_interp.model.protocol import hook_name
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes import sink as sink_probe
from smelt_interp.train.build import build_config
from smelt_interp.train.case_eval import heldout_case
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.trainer import pair_configs

HIDDEN = (5, 7)
SMALL = dict(
    d_model=16, n_layers=4, n_heads=2, n_kv_heads=1, d_head=8, n_experts=2, top_k=1, d_expert=16
)


def cfg_of(looped: bool = False, **fields) -> ModelConfig:
    fields = {**SMALL, "max_seq_len": 32, "hidden_key_ids": HIDDEN, **fields}
    return ModelConfig.smelt(**fields) if looped else ModelConfig.baseline(**fields)


def model_of(looped: bool = False, **fields) -> SmeltModel:
    torch.manual_seed(0)
    model = SmeltModel(cfg_of(looped, **fields)).eval()
    with torch.no_grad():  # sharper attention than the 0.02 init, so hiding moves the output
        for block in model.blocks:
            block.attn.W_q.weight.normal_(std=0.5)
            block.attn.W_k.weight.normal_(std=0.5)
    return model


def tokens_with_hidden(batch: int = 3, length: int = 20, seed: int = 1) -> torch.Tensor:
    """BOS-led rows over a few ids, so that hidden ids occur several times a row."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 10, (batch, length), generator=g)
    tokens[:, 0] = 257
    tokens[0, 1] = HIDDEN[0]  # a hidden token right after BOS
    return tokens


def reference_z(q, k, v, tokens, hides: bool) -> torch.Tensor:
    """z [b, T, H, d] by a float64 loop: each query's softmax over keys j <= i, leaving out
    the keys of hidden tokens (but never position 0) when the layer hides keys."""
    b, t, n_heads, d = q.shape
    group = n_heads // k.shape[2]
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros(b, t, n_heads, d, dtype=torch.float64)
    for row in range(b):
        for h in range(n_heads):
            kv = h // group
            for i in range(t):
                keys = [
                    j
                    for j in range(i + 1)
                    if not (hides and j > 0 and int(tokens[row, j]) in HIDDEN)
                ]
                scores = [float(q[row, i, h] @ k[row, j, kv]) / math.sqrt(d) for j in keys]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for j, w in zip(keys, weights):
                    out[row, i, h] += w / total * v[row, j, kv]
    return out


@pytest.mark.parametrize("looped", [False, True])
@pytest.mark.parametrize("explicit", [False, True])
def test_each_visit_attends_as_the_reference(looped: bool, explicit: bool) -> None:
    model = model_of(looped).double()
    tokens = tokens_with_hidden()
    names = [
        hook_name(layer, visit, f"attn.hook_{x}") for layer, visit in model.schedule for x in "qkvz"
    ]
    with torch.no_grad():
        if explicit:
            with model.explicit_attention():
                _, cache = model.run_with_cache(tokens, names_filter=names)
        else:
            _, cache = model.run_with_cache(tokens, names_filter=names)
    for layer, visit in model.schedule:
        q, k, v, z = (cache[hook_name(layer, visit, f"attn.hook_{x}")] for x in "qkvz")
        want = reference_z(q, k, v, tokens, hides=layer >= 1)
        tol = 1e-7 if explicit else 1e-10  # the explicit path's softmax runs in float32
        torch.testing.assert_close(z, want, atol=tol, rtol=tol)


def test_hiding_changes_the_output_and_only_the_hiding_layers() -> None:
    """Layer 0 is the unhidden model's; the logits differ (the weights are the same)."""
    hiding = model_of()
    seeing = SmeltModel(hiding.cfg.replace(hidden_key_ids=())).eval()
    seeing.load_state_dict(hiding.state_dict())
    tokens = tokens_with_hidden()
    name = hook_name(0, 0, "hook_resid_post")
    with torch.no_grad():
        a_logits, a = hiding.run_with_cache(tokens, names_filter=[name])
        b_logits, b = seeing.run_with_cache(tokens, names_filter=[name])
    torch.testing.assert_close(a[name], b[name])
    assert (a_logits - b_logits).abs().max() > 1e-3


def test_pattern_puts_no_mass_on_hidden_keys_from_the_layer_on() -> None:
    model = model_of(hide_keys_from=2)
    tokens = tokens_with_hidden()
    hidden_cols = torch.isin(tokens, torch.tensor(HIDDEN))  # [b, T]; position 0 is BOS
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    for layer in range(4):
        pattern = cache[hook_name(layer, 0, "attn.hook_pattern")]  # [b, H, T, T]
        on_hidden = (pattern * hidden_cols[:, None, None, :]).sum(dim=-1)
        torch.testing.assert_close(pattern.sum(dim=-1), torch.ones_like(on_hidden))
        if layer >= 2:
            assert on_hidden.abs().max() == 0
        else:
            assert on_hidden.max() > 0.05


def test_position_zero_is_never_hidden() -> None:
    """A row led by a hidden id keeps its first key: no query's softmax empties."""
    model = model_of()
    tokens = torch.full((1, 6), HIDDEN[0])
    with torch.no_grad(), model.explicit_attention():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
        logits = model(tokens)
    assert torch.isfinite(logits).all()
    pattern = cache[hook_name(1, 0, "attn.hook_pattern")][0, 0]
    torch.testing.assert_close(pattern[:, 0], torch.ones(6))


@pytest.mark.parametrize("looped", [False, True])
def test_cached_decoding_keeps_past_flags(looped: bool) -> None:
    """A prefix then one token at a time (hidden ids among them) gives the full forward's
    logits; greedy generation with and without the cache agrees."""
    model = model_of(looped)
    tokens = tokens_with_hidden(2, 16)
    tokens[:, 9] = HIDDEN[1]  # a hidden token among the decoded ones
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache()
        steps = [model(tokens[:, :6], cache=cache)]
        steps += [model(tokens[:, i : i + 1], cache=cache) for i in range(6, 16)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
        cached = model.generate(tokens[:, :5], 8, use_cache=True)
        uncached = model.generate(tokens[:, :5], 8, use_cache=False)
    assert torch.equal(cached, uncached)


def test_compiled_visits_hide_as_eager() -> None:
    """compile_blocks (aot_eager: traced, no code generation) with a key mask: the eager
    model's logits and gradients."""
    torch.manual_seed(0)
    cfg = cfg_of(looped=True)
    model, eager = SmeltModel(cfg).train(), SmeltModel(cfg).train()
    eager.load_state_dict(model.state_dict())
    model.compile_blocks(backend="aot_eager")
    torch._dynamo.reset()
    tokens = tokens_with_hidden(2, 16)
    got, want = model(tokens), eager(tokens)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    got.square().mean().backward()
    want.square().mean().backward()
    for a, b in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)


# ----- measures recomputed from Q and K --------------------------------------------------------
def explicit_patterns(
    model: SmeltModel, tokens: torch.Tensor
) -> dict[tuple[int, int], torch.Tensor]:
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    return {lv: cache[hook_name(*lv, "attn.hook_pattern")] for lv in model.schedule}


def qk_cache(model: SmeltModel, tokens: torch.Tensor):
    names = qk_hook_names(model.schedule)
    with torch.no_grad():
        return model.run_with_cache(tokens, names_filter=names)[1]


@pytest.mark.parametrize("looped", [False, True])
def test_rows_from_q_and_k_are_the_models_pattern(looped: bool) -> None:
    model = model_of(looped)
    tokens = tokens_with_hidden()
    patterns, cache = explicit_patterns(model, tokens), qk_cache(model, tokens)
    hidden = model.hidden_keys(tokens)
    assert sorted(hidden) == [1, 2, 3]
    pos = torch.arange(tokens.shape[1])
    for layer, visit in model.schedule:
        q, k = (cache[hook_name(layer, visit, f"attn.hook_{x}")] for x in "qk")
        rows = attention_rows(q, k, pos, hidden=hidden.get(layer))
        torch.testing.assert_close(rows, patterns[layer, visit], atol=1e-6, rtol=1e-5)


def test_visit_masses_are_the_models_pattern_masses() -> None:
    """The case study's key-set masses (BOS and the hidden keys' own set) from Q and K equal
    those read off the model's materialised pattern."""
    model = model_of(looped=True)
    tokens = tokens_with_hidden()
    b, t = tokens.shape
    patterns, cache = explicit_patterns(model, tokens), qk_cache(model, tokens)
    groups = torch.zeros(b, t, dtype=torch.long)
    bos = torch.zeros(b, t)
    bos[:, 0] = 1
    hidden_set = torch.isin(tokens, torch.tensor(HIDDEN)).float()
    key_sets = torch.stack([bos, hidden_set], dim=1)[:, None].expand(b, t, 2, t)
    got = visit_masses(cache, model.schedule, groups, 1, key_sets, hidden=model.hidden_keys(tokens))
    pos = torch.arange(t)[None].expand(b, -1)
    for i, lv in enumerate(model.schedule):
        want = grouped_mass(pattern_rows(patterns[lv]), pos, groups, 1, key_sets)
        torch.testing.assert_close(got[:, i], want, atol=1e-6, rtol=1e-5)
        assert (got[:, i, 0, :, 1].abs().max() == 0) == (lv[0] >= 1)


def test_sink_probe_reads_the_models_pattern() -> None:
    model = model_of(looped=True)
    tokens = tokens_with_hidden()
    patterns = explicit_patterns(model, tokens)
    heads = sink_probe.measure(model, tokens)
    for (layer, visit), pattern in patterns.items():
        want = pattern[:, :, 1:, 0].double().mean(dim=(0, 2))  # queries 1.., every row full
        got = heads[(heads["layer"] == layer) & (heads["visit"] == visit)].sort_values("head")
        torch.testing.assert_close(torch.tensor(got["sink_mass"].to_numpy()), want)


def test_topk_overlap_takes_each_layers_mask() -> None:
    """Layer 0 (sees every key) against layer 1 (hides some): the overlap of their patterns'
    top keys, recomputed from Q and K with each layer's mask, equals the patterns' own."""
    model = model_of()
    tokens = tokens_with_hidden(2, 24)
    patterns, cache = explicit_patterns(model, tokens), qk_cache(model, tokens)
    hidden = model.hidden_keys(tokens)
    q0, k0, q1, k1 = (cache[hook_name(lay, 0, f"attn.hook_{x}")] for lay in (0, 1) for x in "qk")
    valid = torch.ones(tokens.shape, dtype=torch.bool)
    got = topk_overlap_sum(q0, k0, q1, k1, valid, 4, None, hidden.get(0), hidden.get(1))
    top0 = patterns[0, 0].topk(4, dim=-1).indices  # [b, H, T, 4]
    top1 = patterns[1, 0].topk(4, dim=-1).indices
    same = (top0[..., :, None] == top1[..., None, :]).sum(dim=(-1, -2)).double() / 4
    torch.testing.assert_close(got, same[..., 4:].sum(dim=-1))


# ----- configuration ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fields, message",
    [
        ({"hidden_key_ids": (257,)}, "must not hide BOS"),
        ({"hidden_key_ids": (300,)}, r"must lie in 0\.\.vocab_size-1"),
        ({"hidden_key_ids": (-1,)}, "distinct non-negative integers"),
        ({"hidden_key_ids": (5, 5)}, "distinct non-negative integers"),
        ({"hidden_key_ids": ("a",)}, "distinct non-negative integers"),
        ({"hidden_key_ids": 5}, "distinct non-negative integers"),
        ({"hidden_key_ids": (5,), "hide_keys_from": 4}, "must name a layer below n_layers"),
        ({"hide_keys_from": -1}, "hide_keys_from must be"),
    ],
)
def test_bad_hidden_keys_are_refused_in_one_line(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        ModelConfig.baseline(**{**SMALL, "hidden_key_ids": (), **fields})
    assert "\n" not in str(err.value)


def test_defaults_hide_nothing() -> None:
    cfg = ModelConfig()
    assert cfg.hidden_key_ids == () and not any(cfg.hides_keys(i) for i in range(cfg.n_layers))
    model = SmeltModel(ModelConfig.baseline(**SMALL))
    assert (
        model.key_mask(tokens_with_hidden()) is None
        and model.hidden_keys(tokens_with_hidden()) == {}
    )
    assert "hidden_key_ids" not in model.state_dict()


def test_the_option_travels_with_the_config(tmp_path) -> None:
    """`--set model.hidden_key_ids=[16]` (a JSON list) reaches the Baseline, the matcher's SMELT
    and a checkpoint's config."""
    sets = ["model.hidden_key_ids=[16]", "model.hide_keys_from=2"]
    cfg = build_config("recall-pair", None, sets)
    assert cfg.model.hidden_key_ids == (16,) and cfg.model.hide_keys_from == 2
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    smelt = pair_configs(cfg)["smelt"].model_config()
    assert smelt.is_looped and (smelt.hidden_key_ids, smelt.hide_keys_from) == ((16,), 2)
    save_checkpoint(tmp_path / "ckpt.pt", SmeltModel(smelt))
    loaded, _ = load_checkpoint(tmp_path / "ckpt.pt")
    assert loaded.cfg == smelt
    assert [block.hides_keys for block in loaded.blocks] == [False, False, True, True]


def test_trainer_case_evaluation_reads_the_models_pattern() -> None:
    """The trainer's held-out case evaluation (BOS at non-answer positions per visit and head)
    equals the mean BOS column of the model's own pattern over those positions."""
    spec = AssocRecallSpec(n_triggers=1)
    model = model_of(looped=True, hidden_key_ids=spec.trigger_ids)
    rows = recall_rows(4, 32, 0, split="heldout", spec=spec)
    record = heldout_case(model, rows, spec)
    patterns = explicit_patterns(model, rows)
    non_answer = recall_case(rows, spec.trigger_ids).groups(MAX_DEMOS + 2) == MAX_DEMOS + 1
    for (layer, visit), pattern in patterns.items():
        bos = pattern[..., 0].permute(0, 2, 1)[non_answer]  # [queries, H]
        for head in range(2):
            got = record[f"case/bos_non_answer/{layer}.{visit}.{head}"]
            assert got == pytest.approx(float(bos[:, head].double().mean()), abs=1e-6)


def test_dashboard_patterns_are_the_models() -> None:
    """The attention page's patterns and BOS shares, whole and pooled, hide what the model
    hides (pooled blocks of one position are the pattern itself)."""
    model = model_of(looped=True)
    registry = ModelRegistry.from_models({"smelt": model})
    prompt = "ab\x05cd\x07\x05ef\x07gh"
    run = run_prompt(registry, "smelt", prompt)
    patterns = explicit_patterns(model, torch.tensor([run.ids]))
    pooled = pattern_cap.DrawableRun(run, side=len(run.ids))
    pooled.pooled = True
    for (layer, visit), want in patterns.items():
        torch.testing.assert_close(torch.from_numpy(run.pattern(layer, visit)), want[0])
        got = torch.from_numpy(pooled.pattern(layer, visit))
        torch.testing.assert_close(got, want[0], atol=1e-6, rtol=1e-5)
        share = want[0, :, 1:, 0].double().mean(dim=-1)
        torch.testing.assert_close(torch.from_numpy(pooled.bos_share(layer, visit)), share)
