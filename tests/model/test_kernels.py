"""The kernel switches (model.kernels) against the default path on the CPU: outputs and
gradients equal within float32 rounding for Baseline and SMELT, with hooks attached and without
(every hook point firing with the same shape), within bf16 rounding under bf16 autocast and for
the experts on bf16 rows; the weight cache bitwise equal where the default casts explicitly,
and refreshed by an optimizer step; a compiled visit with the switches on as one graph; the
SDPA priority and its log; the config section and its saved record."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from smelt_interp.config import ModelConfig
from smelt_interp.errors import ConfigError
from smelt_interp.model.kernels import SDPA_BACKENDS, KernelOptions, sdpa_backend, sdpa_context
from smelt_interp.model.moe import Experts
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.train.config import TrainConfig

SHAPE = dict(
    d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_head=8, n_experts=4, top_k=2, d_expert=16,
    max_seq_len=64,
)  # fmt: skip
CONFIGS = {"baseline": ModelConfig.baseline(**SHAPE), "smelt": ModelConfig.smelt(**SHAPE)}
SWITCHES = {
    "moe_gather": {"moe_gather": True},
    "fused_qkv": {"fused_qkv": True},
    "weight_cache": {"weight_cache": True},
    "sdpa": {"sdpa_priority": ("math", "flash"), "log_sdpa": True},
    "all": {
        "moe_gather": True, "fused_qkv": True, "weight_cache": True,
        "sdpa_priority": ("efficient", "flash"),
    },
}  # fmt: skip
FP32_TOL = 1e-5  # measured <= 1e-7 (the gather path sums the k slots in another order)
BF16_REL = 2e-2  # of the largest gradient; measured 3e-3 (fused QKV's cast of the joined rows)


def _models(arch: str, options: dict) -> tuple[SmeltModel, SmeltModel]:
    """The default model and a copy with the switches on, same weights."""
    torch.manual_seed(0)
    ref = SmeltModel(CONFIGS[arch])
    other = SmeltModel(CONFIGS[arch])
    other.load_state_dict(ref.state_dict())
    return ref, KernelOptions(**options).apply(other)


def _run(model: SmeltModel, tokens: torch.Tensor, hooked: bool, bf16: bool = False):
    """(logits, {param: grad}, [(hook name, shape)] in firing order)."""
    fired: list[tuple[str, tuple[int, ...]]] = []

    def record(x: torch.Tensor, hook) -> torch.Tensor:  # noqa: ANN001 - TransformerLens's
        fired.append((hook.name, tuple(x.shape)))
        return x

    hooks = [(lambda name: True, record)] if hooked else []
    model.zero_grad(set_to_none=True)
    with model.hooks(fwd_hooks=hooks), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        logits = model(tokens)
        aux = model.aux_losses
        loss = logits.float().square().mean() + aux["load_balance"] + aux["z_loss"]
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return logits.detach().float(), grads, fired


@pytest.mark.parametrize("hooked", [False, True], ids=["plain", "hooked"])
@pytest.mark.parametrize("switch", list(SWITCHES))
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_switch_matches_the_default_path_in_float32(arch: str, switch: str, hooked: bool) -> None:
    ref, other = _models(arch, SWITCHES[switch])
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    logits, grads, fired = _run(ref, tokens, hooked)
    logits2, grads2, fired2 = _run(other, tokens, hooked)
    torch.testing.assert_close(logits2, logits, atol=FP32_TOL, rtol=FP32_TOL)
    for name, grad in grads.items():
        torch.testing.assert_close(grads2[name], grad, atol=FP32_TOL, rtol=FP32_TOL, msg=name)
    assert fired2 == fired
    if hooked:  # every visit's hook points, each once
        assert len(fired) == len(set(fired)) and len(fired) == 2 + 13 * len(ref.schedule)


@pytest.mark.parametrize("hooked", [False, True], ids=["plain", "hooked"])
@pytest.mark.parametrize("switch", ["fused_qkv", "weight_cache", "all"])
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_switch_matches_the_default_path_under_bf16_autocast(
    arch: str, switch: str, hooked: bool
) -> None:
    ref, other = _models(arch, SWITCHES[switch])
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(2))
    logits, grads, fired = _run(ref, tokens, hooked, bf16=True)
    logits2, grads2, fired2 = _run(other, tokens, hooked, bf16=True)
    torch.testing.assert_close(logits2, logits, atol=2e-2, rtol=2e-2)
    scale = max(g.abs().max().item() for g in grads.values())
    for name, grad in grads.items():
        assert (grads2[name] - grad).abs().max().item() <= BF16_REL * scale, name
    assert fired2 == fired


def _experts(options: dict) -> Experts:
    torch.manual_seed(3)
    experts = Experts(CONFIGS["baseline"])
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return KernelOptions(**options).apply(experts)


def _expert_pass(experts: Experts, visits: int = 2) -> tuple[torch.Tensor, dict]:
    """`visits` calls on bf16 rows (as on a GPU under autocast), one backward: output, grads."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(24, 32, generator=gen).to(torch.bfloat16).requires_grad_()
    indices = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(24)])
    weights = torch.rand(24, 2, generator=gen).softmax(-1).requires_grad_()
    experts.zero_grad(set_to_none=True)
    out = sum(experts(x, indices, weights).float() for _ in range(visits))
    out.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in experts.named_parameters()}
    return out.detach(), {**grads, "x": x.grad, "weights": weights.grad}


def test_expert_switches_on_bf16_rows() -> None:
    """The weight cache gives the default's bits (the cast is the same; each use's gradient is
    cast back as before); the gather permutation matches within bf16 rounding."""
    out, grads = _expert_pass(_experts({}))
    cached_out, cached = _expert_pass(_experts({"weight_cache": True}))
    assert torch.equal(cached_out, out)
    for name, grad in grads.items():
        assert torch.equal(cached[name], grad), name
    gather_out, gathered = _expert_pass(_experts({"moe_gather": True, "weight_cache": True}))
    torch.testing.assert_close(gather_out, out, atol=0.05, rtol=0.02)
    for name, grad in grads.items():
        scale = grad.abs().max().item()
        assert (gathered[name].float() - grad.float()).abs().max() <= 0.02 * scale, name


def test_the_weight_cache_is_made_once_per_optimizer_step() -> None:
    experts = _experts({"weight_cache": True})
    optimizer = torch.optim.AdamW(experts.parameters(), lr=0.1)
    _expert_pass(experts)
    copies = experts._weight_copies
    first = copies["gate_up"][1]
    _expert_pass(experts)  # a second micro-batch: the same copy
    assert copies["gate_up"][1] is first
    optimizer.step()
    out, _ = _expert_pass(experts)
    assert copies["gate_up"][1] is not first
    fresh = _experts({})
    fresh.load_state_dict(experts.state_dict())
    assert torch.equal(out, _expert_pass(fresh)[0])  # the new weights' copy, not the old


def test_compiled_visit_with_the_switches_is_one_graph() -> None:
    """fullgraph=True: the gathers, the fused projection and the SDPA priority trace as one
    graph (the weight cache stands aside inside a compiled graph); the same logits."""
    options = {**SWITCHES["all"], "compile_fullgraph": True}
    ref, other = _models("smelt", options)
    other.compile_blocks(backend="aot_eager", **other.blocks[0].attn.kernels.compile_options())
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(5))
    logits, grads, _ = _run(ref, tokens, hooked=False)
    logits2, grads2, _ = _run(other, tokens, hooked=False)
    torch.testing.assert_close(logits2, logits, atol=FP32_TOL, rtol=FP32_TOL)
    for name, grad in grads.items():
        torch.testing.assert_close(grads2[name], grad, atol=FP32_TOL, rtol=FP32_TOL, msg=name)


def test_sdpa_priority_picks_the_backend_and_the_log_names_it(caplog) -> None:
    """The order is set as given, the rest in torch's order (a GPU reads it; a CPU picks by its
    own rule among the enabled backends, so there the choice follows what is enabled)."""
    q, k = torch.randn(2, 4, 16, 8), torch.randn(2, 2, 16, 8)
    with sdpa_context(["cudnn", "math"]):
        order = [SDPBackend(i) for i in torch._C._get_sdp_priority_order()]
        assert order[:4] == [SDPA_BACKENDS[n] for n in ("cudnn", "math", "flash", "efficient")]
    assert sdpa_backend(q, k, k, is_causal=True) == "flash"  # the CPU's flash kernel
    with sdpa_kernel([SDPBackend.MATH]):
        assert sdpa_backend(q, k, k, is_causal=True) == "math"
    _, model = _models("baseline", {"log_sdpa": True, "sdpa_priority": ("math",)})
    with caplog.at_level(logging.INFO, logger="smelt_interp.kernels"):
        model(torch.randint(0, 256, (3, 10)))
    assert "q [3, 4, 10, 8] k [3, 2, 10, 8] float32 causal on cpu -> flash" in caplog.text


def test_the_kernels_section_is_saved_only_when_set() -> None:
    cfg = TrainConfig()
    assert "kernels" not in cfg.to_dict()
    on = cfg.with_overrides({"kernels.fused_qkv": True, "kernels.sdpa_priority": ["cudnn"]})
    record = on.to_dict()
    assert record["kernels"] == {"fused_qkv": True, "sdpa_priority": ["cudnn"]}
    assert TrainConfig.from_dict(record).kernels == on.kernels
    assert on.kernels.compile_options() == {}
    compiled = on.with_overrides(
        {"kernels": {"compile_fullgraph": True, "compile_mode": "max-autotune-no-cudagraphs"}}
    )
    assert compiled.kernels.compile_options() == {
        "fullgraph": True,
        "mode": "max-autotune-no-cudagraphs",
    }
    for bad in (
        {"kernels.sdpa_priority": ["fast"]},
        {"kernels.sdpa_priority": ["math", "math"]},
        {"kernels.compile_mode": "reduce-overhead"},
        {"kernels.fused_qkv": "yes"},
    ):
        with pytest.raises(ConfigError, match="kernels"):
            cfg.with_overrides(bad)


def test_the_trainer_applies_the_switches_and_the_compile_options(tmp_path, monkeypatch) -> None:
    from smelt_interp.train.presets import get_preset
    from smelt_interp.train.trainer import Trainer

    seen: dict = {}
    monkeypatch.setattr(SmeltModel, "compile_blocks", lambda self, **kw: seen.update(kw))
    cfg = TrainConfig.from_dict(
        {
            **get_preset("dyck-pair-tiny"),
            "compile": True,
            "kernels": {"moe_gather": True, "compile_mode": "max-autotune-no-cudagraphs"},
        }
    )
    trainer = Trainer(cfg, tmp_path, progress=False)
    trainer.forward_model  # noqa: B018 - builds the wrapper, which compiles
    trainer.batches.close()
    assert all(b.moe.experts.kernels.moe_gather for b in trainer.model.blocks)
    assert seen == {"mode": "max-autotune-no-cudagraphs"}
