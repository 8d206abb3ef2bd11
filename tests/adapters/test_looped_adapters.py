"""The looped-model adapter (smelt_interp.adapters) on tiny random-initialised HRM-Text, Dory and
Inkling2Loop models built offline: the schedule against the layer calls, each visit's residual
against the layer's own input and output, BOS and learned-sink mass against float64 attention
recomputed from the module's own Q and K, routing overlap against the router's outputs, the
logits against the plain model's, interventions, nnsight, and the loader's one-line refusals.
The references hook a separate copy of the model ("plain"), never the adapter's."""

from __future__ import annotations

import copy
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from helpers.tiny_looped import VOCAB, make_config, tiny_model  # noqa: E402
from transformers import AttentionInterface  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface, eager_mask  # noqa: E402

from smelt_interp.adapters import LoopedAdapter, adapt, is_looped_folder, load_looped  # noqa: E402
from smelt_interp.errors import CheckpointError, TokenError  # noqa: E402
from smelt_interp.model.protocol import (  # noqa: E402
    LoopedModel,
    ModelShape,
    hook_name,  # noqa: E402
)

T = 9
ARCHS = ("hrm_text", "dory", "inkling2_loop")


def layer_modules(hf: nn.Module) -> list[nn.Module]:
    """The decoder layers by the adapter's numbering, found independently of the adapter."""
    if hf.config.model_type == "hrm_text":
        return [*hf.model.L_module.layers, *hf.model.H_module.layers]
    return list(hf.model.layers)


class Built:
    """One architecture's adapter and an untouched copy of the same weights ("plain")."""

    def __init__(self, arch: str) -> None:
        hf = tiny_model(arch)
        self.plain = copy.deepcopy(hf)  # default attention: sdpa (HRM, Dory), eager (Inkling)
        self.adapter = adapt(hf)
        self.tokens = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))

    def calls(self, attach: Any) -> None:
        """Run plain on the tokens with `attach(number, layer)`'s handles in place."""
        handles = [h for n, m in enumerate(layer_modules(self.plain)) for h in attach(n, m)]
        try:
            with torch.no_grad():
                self.plain(input_ids=self.tokens, use_cache=False)
        finally:
            for h in handles:
                h.remove()


@pytest.fixture(scope="module", params=ARCHS)
def built(request: pytest.FixtureRequest) -> Built:
    return Built(request.param)


def visit_keyed(records: list[tuple[int, Any]]) -> dict[tuple[int, int], Any]:
    """Number each layer's calls in order: (layer, visit) -> record."""
    seen: dict[int, int] = defaultdict(int)
    out = {}
    for layer, rec in records:
        out[(layer, seen[layer])] = rec
        seen[layer] += 1
    return out


# ----- schedule, residuals, logits ------------------------------------------------------------
def test_schedule_is_the_order_of_layer_calls(built: Built) -> None:
    order: list[int] = []
    built.calls(lambda n, m: [m.register_forward_pre_hook(lambda *_, n=n: order.append(n))])
    assert tuple(visit_keyed([(n, None) for n in order])) == built.adapter.schedule
    cfg = built.adapter.cfg
    assert isinstance(cfg, ModelShape) and isinstance(built.adapter, LoopedModel)
    assert cfg.is_looped and cfg.effective_depth == len(order)
    assert all(cfg.visits_of(layer) >= 2 for layer in cfg.looped_layers)


def test_each_visit_resid_equals_the_layer_call(built: Built) -> None:
    records: list[tuple[int, Any]] = []

    def attach(n: int, m: nn.Module) -> list[Any]:
        return [m.register_forward_hook(lambda _m, a, out, n=n: records.append((n, (a[0], out))))]

    built.calls(attach)
    calls = visit_keyed(records)
    _, cache = built.adapter.run_with_cache(built.tokens)
    assert tuple(calls) == built.adapter.schedule
    for (layer, visit), (inp, out) in calls.items():
        pre = cache[hook_name(layer, visit, "hook_resid_pre")]
        post = cache[hook_name(layer, visit, "hook_resid_post")]
        torch.testing.assert_close(pre, inp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(post, out, atol=1e-5, rtol=1e-5)


def test_logits_equal_the_plain_model(built: Built) -> None:
    with torch.no_grad():
        want = built.plain(input_ids=built.tokens).logits.float()
        got = built.adapter(built.tokens)
    assert got.shape == (2, T, built.adapter.cfg.vocab_size) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_unembed_resid_reads_the_last_layer_as_the_logits(built: Built) -> None:
    adapter = built.adapter
    logits, cache = adapter.run_with_cache(built.tokens)
    last = cache[hook_name(*adapter.schedule[-1], "hook_resid_post")]
    lens = adapter.unembed_resid(last)
    assert lens.shape == logits.shape and lens.dtype == torch.float32
    if adapter.cfg.arch != "inkling2_loop_text":  # Inkling's final block mix is not applied
        torch.testing.assert_close(lens, logits, atol=1e-5, rtol=1e-5)


# ----- attention: BOS and learned-sink mass in float64 ----------------------------------------
def float64_attention(records: list[tuple[int, Any]], numbers: dict[int, int]) -> Any:
    """An attention function that records float64 softmax weights recomputed from the
    module's own Q and K (plus its bias, mask and sink logit), and runs its eager attention."""

    def fn(module: nn.Module, q: Any, k: Any, v: Any, attention_mask: Any, **kw: Any) -> Any:
        mask = attention_mask  # Dory passes it by keyword
        eager = sys.modules[type(module).__module__].eager_attention_forward
        if id(module) in numbers:
            groups = q.shape[1] // k.shape[1]
            keys = k.double().repeat_interleave(groups, dim=1)
            logits = q.double() @ keys.transpose(-1, -2) * kw["scaling"]
            if kw.get("position_bias") is not None:
                logits = logits + kw["position_bias"].double()
            if mask is not None:
                logits = logits + mask.double()
            sinks = kw.get("sinks")
            if sinks is not None:
                logits = torch.cat([logits, sinks.double().expand(*logits.shape[:-1], 1)], -1)
            probs = logits.softmax(-1)
            keys_part, sink = (
                (probs[..., :-1], probs[..., -1]) if sinks is not None else (probs, None)
            )
            records.append((numbers[id(module)], (keys_part, sink)))
        return eager(module, q, k, v, mask, **kw)

    return fn


@pytest.mark.parametrize("prefix", [False, True])
def test_bos_and_sink_mass_equal_float64_eager(built: Built, prefix: bool) -> None:
    kwargs = {}
    if prefix:  # HRM's prefix-LM mask: the first 4 tokens see each other
        if built.adapter.cfg.arch != "hrm_text":
            pytest.skip("prefix-LM mask is HRM's")
        kwargs["token_type_ids"] = (torch.arange(T) < 4).long().expand(2, T)
    records: list[tuple[int, Any]] = []
    numbers = {id(m.self_attn): n for n, m in enumerate(layer_modules(built.plain))}
    AttentionInterface.register("test_float64", float64_attention(records, numbers))
    AttentionMaskInterface.register("test_float64", eager_mask)
    plain = copy.deepcopy(built.plain)
    plain.config._attn_implementation = "test_float64"
    with torch.no_grad():
        plain(input_ids=built.tokens, use_cache=False, **kwargs)
    want = visit_keyed(records)
    _, cache = built.adapter.run_with_cache(built.tokens, **kwargs)
    sinks = built.adapter.cfg.learned_sinks
    for (layer, visit), (weights, sink) in want.items():
        pattern = cache[hook_name(layer, visit, "attn.hook_pattern")].double()
        assert pattern.shape == weights.shape
        bos = pattern[:, :, 1:, 0].mean(dim=(0, 2))  # per head: mean over queries 1..T-1
        torch.testing.assert_close(bos, weights[:, :, 1:, 0].mean(dim=(0, 2)), atol=1e-6, rtol=0)
        assert (sink is not None) == sinks
        if sinks:
            slot = (1 - pattern.sum(-1))[:, :, 1:].mean(dim=(0, 2))
            torch.testing.assert_close(slot, sink[:, :, 1:].mean(dim=(0, 2)), atol=1e-6, rtol=0)
            assert slot.min() > 0.01  # the sink holds real mass in this model
    if prefix:  # the prefix block is bidirectional: query 0 sees key 3
        assert cache[hook_name(0, 0, "attn.hook_pattern")][:, :, 0, 3].min() > 0


# ----- routing ----------------------------------------------------------------------------------
def overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean count of experts two visits share per token: a, b [..., top_k] indices."""
    return (a[..., :, None] == b[..., None, :]).any(-1).sum(-1).double().mean().item()


def test_routing_overlap_equals_the_router_outputs(built: Built) -> None:
    cfg = built.adapter.cfg
    if cfg.n_experts == 1:
        pytest.skip(f"{cfg.arch} has a dense MLP")
    records: list[tuple[int, Any]] = []

    def attach(n: int, m: nn.Module) -> list[Any]:
        return [m.mlp.gate.register_forward_hook(lambda _m, a, o, n=n: records.append((n, o)))]

    built.calls(attach)
    routed = visit_keyed(records)
    _, cache = built.adapter.run_with_cache(built.tokens)
    for layer in cfg.looped_layers:
        got = [cache[hook_name(layer, v, "moe.hook_expert_indices")] for v in range(3)]
        want = [routed[(layer, v)][2].view(2, T, -1) for v in range(3)]
        assert got[0].shape == (2, T, cfg.top_k) and not got[0].is_floating_point()
        for v, w in ((0, 1), (1, 2), (0, 2)):
            assert overlap(got[v], got[w]) == overlap(want[v], want[w])
        logits = routed[(layer, 1)][0].view(2, T, -1)
        torch.testing.assert_close(cache[hook_name(layer, 1, "moe.hook_router_logits")], logits)
        weights = cache[hook_name(layer, 1, "moe.hook_expert_weights")]
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, T))


# ----- visits apart, interventions, nnsight -------------------------------------------------------
def test_run_with_cache_keeps_visits_apart_and_nnsight_reads_a_later_visit(
    built: Built, monkeypatch: pytest.MonkeyPatch
) -> None:
    nnsight = pytest.importorskip("nnsight")
    from nnsight.schema.config import CONFIG

    monkeypatch.setattr(CONFIG.APP, "DEBUG", False)
    adapter, layer = built.adapter, built.adapter.cfg.looped_layers[-1]
    _, cache = adapter.run_with_cache(built.tokens)
    for name in ("hook_resid_post", "attn.hook_q", "attn.hook_pattern", "hook_mlp_out"):
        a, b = cache[hook_name(layer, 0, name)], cache[hook_name(layer, 1, name)]
        assert a.shape == b.shape and not torch.allclose(a, b)
    nm = nnsight.NNsight(adapter)
    with nm.trace(built.tokens):
        hooks = nm.blocks[layer].visits[1]
        q = hooks.attn.hook_q.output.save()  # nnsight reads in execution order
        post = hooks.hook_resid_post.output.save()
    torch.testing.assert_close(post.detach(), cache[hook_name(layer, 1, "hook_resid_post")])
    torch.testing.assert_close(q.detach(), cache[hook_name(layer, 1, "attn.hook_q")])


def test_hooks_replace_the_writes(built: Built) -> None:
    adapter, layer = built.adapter, built.adapter.cfg.looped_layers[0]
    zero = lambda x, hook: torch.zeros_like(x)  # noqa: E731
    names = [hook_name(layer, 1, "hook_mlp_out"), hook_name(layer, 1, "hook_attn_out")]
    with torch.no_grad():
        clean = adapter(built.tokens)
    for name in names:
        cache: dict[str, torch.Tensor] = {}
        keep = lambda x, hook: cache.__setitem__(hook.name, x.detach())  # noqa: E731
        fwd = [(name, zero), (lambda n: n.startswith(f"blocks.{layer}.visits.1."), keep)]
        with torch.no_grad():
            edited = adapter.run_with_hooks(built.tokens, fwd_hooks=fwd)
        assert not torch.allclose(edited, clean)
        pre, mid, post = (
            cache[hook_name(layer, 1, n)]
            for n in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")
        )
        if name.endswith("mlp_out"):  # nothing written after the mid residual
            torch.testing.assert_close(post, mid, atol=1e-6, rtol=0)
        elif adapter.cfg.arch != "inkling2_loop_text" or layer % 2:  # not a block's first layer
            torch.testing.assert_close(mid, pre, atol=1e-6, rtol=0)
    cache = {}
    keep = lambda x, hook: cache.__setitem__(hook.name, x.detach())  # noqa: E731
    mid = hook_name(layer, 1, "hook_resid_mid")
    fwd = [(mid, zero), (lambda n: n.startswith(f"blocks.{layer}.visits.1.hook_"), keep)]
    with torch.no_grad():  # a replaced mid residual carries to the layer's output
        adapter.run_with_hooks(built.tokens, fwd_hooks=fwd)
    post, mlp = (cache[hook_name(layer, 1, n)] for n in ("hook_resid_post", "hook_mlp_out"))
    torch.testing.assert_close(post, mlp, atol=1e-6, rtol=0)
    pattern = hook_name(layer, 1, "attn.hook_pattern")
    with torch.no_grad():  # an edited pattern mixes the values as the model's attention does
        same = adapter.run_with_hooks(built.tokens, fwd_hooks=[(pattern, lambda x, hook: x * 1)])
        torch.testing.assert_close(same, clean, atol=1e-6, rtol=1e-5)
        bos = lambda x, hook: torch.zeros_like(x).index_fill_(-1, torch.tensor([0]), 1.0)  # noqa: E731
        assert not torch.allclose(
            adapter.run_with_hooks(built.tokens, fwd_hooks=[(pattern, bos)]), clean
        )
    with torch.no_grad():  # no hook left behind: the clean logits again
        torch.testing.assert_close(adapter(built.tokens), clean, atol=0, rtol=0)


def test_tokens_are_checked(built: Built) -> None:
    with pytest.raises(TokenError):
        built.adapter(torch.tensor([[0, VOCAB]]))
    with pytest.raises(TokenError):
        built.adapter(torch.zeros(1, 3))
    with pytest.raises(TokenError):
        built.adapter(torch.zeros(1, 65, dtype=torch.long))
    assert built.adapter.hidden_keys(built.tokens) == {}


# ----- loading a folder --------------------------------------------------------------------------
def test_load_looped_reads_a_saved_folder(built: Built, tmp_path: Path) -> None:
    folder = tmp_path / f"tiny-{built.adapter.cfg.arch}"
    built.plain.save_pretrained(folder)
    assert is_looped_folder(folder) and not is_looped_folder(folder / "config.json")
    loaded = load_looped(folder)
    assert isinstance(loaded, LoopedAdapter)
    assert loaded.cfg.name == folder.name and loaded.cfg.first_token_id is None
    assert loaded.cfg.schedule == built.adapter.cfg.schedule
    with torch.no_grad():
        torch.testing.assert_close(loaded(built.tokens), built.adapter(built.tokens))


def test_an_image_text_inkling_folder_loads_its_language_model(tmp_path: Path) -> None:
    from transformers.models.inkling2_loop.configuration_inkling2_loop import Inkling2LoopConfig

    vision = dict(
        model_type="inkling2_vision", hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        text_hidden_size=32, patch_size=4,
    )  # fmt: skip
    config = Inkling2LoopConfig(
        text_config=make_config("inkling2_loop").to_dict(), vision_config=vision
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForImageTextToText.from_config(config).eval()
    model.save_pretrained(tmp_path / "tiny-inkling-vl")
    loaded = load_looped(tmp_path / "tiny-inkling-vl")
    assert loaded.cfg.arch == "inkling2_loop" and loaded.cfg.learned_sinks
    assert loaded.cfg.layer_names[0] == "model.language_model.layers.0"
    tokens = torch.randint(0, VOCAB, (1, T))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model(input_ids=tokens).logits.float())


@pytest.mark.parametrize("adds_bos", [True, False])
def test_first_token_is_the_bos_the_tokenizer_adds(
    saved_hrm: Path, tmp_path: Path, adds_bos: bool
) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel({"<s>": 0, "[UNK]": 1, "a": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", 0)]
        )
    folder = edited_copy(saved_hrm, tmp_path / "with-tokenizer")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", unk_token="[UNK]"
    )
    fast.save_pretrained(folder)
    assert load_looped(folder).cfg.first_token_id == (0 if adds_bos else None)


def refusal(folder: Path, **kwargs: Any) -> str:
    with pytest.raises(CheckpointError) as err:
        load_looped(folder, **kwargs)
    message = str(err.value)
    assert "\n" not in message and str(folder) in message
    return message


@pytest.fixture(scope="module")
def saved_hrm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hrm") / "tiny-hrm"
    transformers.AutoModelForCausalLM.from_config(make_config("hrm_text")).save_pretrained(folder)
    return folder


def edited_copy(src: Path, dst: Path, **changes: Any) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    config = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **changes}))
    return dst


def test_a_folder_without_config_is_refused(tmp_path: Path) -> None:
    assert "config.json" in refusal(tmp_path)


def test_an_unknown_architecture_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    message = refusal(tmp_path)
    assert "'gpt2'" in message and "hrm_text, dory, inkling2_loop, llama" in message


def test_mismatched_or_missing_weights_are_refused(saved_hrm: Path, tmp_path: Path) -> None:
    wide = edited_copy(saved_hrm, tmp_path / "wide", intermediate_size=48)
    assert "do not match" in refusal(wide) and "mismatched" in refusal(wide)
    deep = edited_copy(saved_hrm, tmp_path / "deep", num_layers_per_stack=3, num_hidden_layers=18)
    assert "missing keys" in refusal(deep)


def test_remote_code_needs_permission(saved_hrm: Path, tmp_path: Path) -> None:
    remote = edited_copy(
        saved_hrm, tmp_path / "remote", auto_map={"AutoConfig": "configuration_x.XConfig"}
    )
    assert "trust_remote_code" in refusal(remote)
