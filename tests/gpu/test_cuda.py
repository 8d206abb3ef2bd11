"""CUDA-only checks: a bf16 autocast forward against fp32, bf16 grouped_mm against the per-expert
loop, the flash SDPA kernel against the explicit attention path, and cached generation against
recompute. Skipped without CUDA. `SMELT_CUDA_TESTS_DEVICE=cpu` runs the same logic on the CPU
(bf16 autocast, bf16 grouped_mm and the CPU flash kernel all exist there), so the checks
themselves are exercised on a machine without a GPU; `gpu.check` runs them on one.

Tolerances are stated beside each check. bf16 keeps 8 significant bits (relative rounding
2^-9 ~ 0.2%), and errors of a few such roundings accumulate through a deep forward pass."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from smelt_interp.config import ModelConfig
from smelt_interp.model.kv_cache import KVCache
from smelt_interp.model.moe import Experts
from smelt_interp.model.transformer import SmeltModel

DEVICE_ENV = "SMELT_CUDA_TESTS_DEVICE"
DEVICE_NAME = os.environ.get(DEVICE_ENV, "cuda")
if DEVICE_NAME not in ("cuda", "cpu"):
    raise pytest.UsageError(f"{DEVICE_ENV} must be 'cuda' or 'cpu', got {DEVICE_NAME!r}")
DEVICE = torch.device(DEVICE_NAME)

pytestmark = pytest.mark.skipif(
    DEVICE.type == "cuda" and not torch.cuda.is_available(),
    reason=f"needs CUDA (set {DEVICE_ENV}=cpu to run these checks on the CPU)",
)

# Small enough for a shared CPU, wide enough that bf16 kernels see realistic shapes (every width
# a multiple of 8, so bf16 rows are 16-byte aligned for grouped_mm).
SHAPE = dict(
    d_model=128,
    n_layers=4,
    n_heads=4,
    n_kv_heads=2,
    d_head=32,
    n_experts=8,
    top_k=2,
    d_expert=64,
    max_seq_len=512,
)


def make_model(looped: bool, seed: int = 0, **fields) -> SmeltModel:
    merged = {**SHAPE, **fields}
    cfg = ModelConfig.smelt(**merged) if looped else ModelConfig.baseline(**merged)
    torch.manual_seed(seed)
    return SmeltModel(cfg).to(DEVICE).eval()


def tokens(batch: int, pos: int, seed: int = 0, vocab: int = 256) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    out = torch.randint(1, vocab, (batch, pos), generator=gen)
    out[:, 0] = 0  # BOS
    return out.to(DEVICE)


def rel_rms(x: torch.Tensor, ref: torch.Tensor) -> float:
    """RMS of the error over the RMS of the reference: robust to a few large entries."""
    x, ref = x.detach().double(), ref.detach().double()
    return float((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())


class OpCounter(TorchDispatchMode):
    """Counts the ATen (and custom) ops whose name contains a substring, so a test can show the
    kernel under test really ran instead of a fallback."""

    def __init__(self, needle: str) -> None:
        super().__init__()
        self.needle = needle
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.needle in str(func):
            self.count += 1
        return func(*args, **(kwargs or {}))


# ----- bf16 autocast forward against fp32 ------------------------------------------------------


@pytest.mark.parametrize("looped", [False, True], ids=["baseline", "smelt"])
def test_bf16_autocast_forward_matches_fp32(looped: bool) -> None:
    """Logits under bf16 autocast against the fp32 forward of the same weights. Tolerance:
    relative RMS error <= 3% of the logits, and mean cross-entropy within 0.02 nats, at the
    trainer's initialisation (std 0.02; measured on CPU: 0.7% for the Baseline). A few routing
    decisions flip under bf16 (near-tied router scores), which dominates the error: at std 0.1
    it reaches 8%, and 1% with top-k = all experts (no flips). A wrong kernel or a dtype bug
    (garbage, overflow) does not pass the bound."""
    model = make_model(looped)
    x = tokens(4, 256)
    with torch.no_grad():
        ref = model(x).float()
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            low = model(x)
    assert low.dtype == torch.bfloat16  # autocast really ran the unembedding in bf16
    err = rel_rms(low, ref)
    assert 0 < err <= 0.03, f"relative RMS error {err:.4f}"
    targets = x[:, 1:].reshape(-1)
    ce_ref = F.cross_entropy(ref[:, :-1].reshape(-1, ref.shape[-1]), targets)
    ce_low = F.cross_entropy(low[:, :-1].float().reshape(-1, ref.shape[-1]), targets)
    assert abs(float(ce_low - ce_ref)) <= 0.02


# ----- bf16 grouped_mm against the per-expert loop --------------------------------------------


@pytest.mark.parametrize("n_experts, k, n", [(8, 2, 512), (16, 4, 333), (8, 1, 5)])
def test_bf16_grouped_mm_matches_loop(n_experts: int, k: int, n: int) -> None:
    """The grouped dispatch in bf16 against the per-expert loop in fp32 on the same
    bf16-rounded inputs and weights, forward and gradients. Tolerance: relative RMS error
    <= 1.5% on the output, the input gradient and every weight gradient (0.5% measured on
    CPU, from the bf16 rounding of the hidden layer). (8, 1, 5): most experts get no token,
    so empty groups are covered."""
    cfg = ModelConfig(d_model=128, d_expert=64, n_experts=n_experts, top_k=k)
    torch.manual_seed(0)
    experts = Experts(cfg)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.1)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, cfg.d_model, generator=gen).to(torch.bfloat16)
    indices = torch.stack([torch.randperm(n_experts, generator=gen)[:k] for _ in range(n)])
    weights = torch.rand(n, k, generator=gen).softmax(-1)
    proj = torch.randn(n, cfg.d_model, generator=gen)  # grouped_mm's CPU backward wants no
    # stride-0 gradient, so the loss is a random projection, not a sum

    def run(dtype: torch.dtype, dispatch: str):
        module = Experts(cfg)
        module.load_state_dict({k: v.to(torch.bfloat16) for k, v in experts.state_dict().items()})
        module = module.to(DEVICE, dtype)
        xi = x.to(DEVICE, dtype).clone().requires_grad_()
        counter = OpCounter("grouped_mm")
        with counter:
            y = module(xi, indices.to(DEVICE), weights.to(DEVICE, dtype), dispatch)
        (y.float() * proj.to(DEVICE)).sum().backward()
        grads = [xi.grad] + [p.grad for p in module.parameters()]
        return y, grads, counter.count

    y, grads, calls = run(torch.bfloat16, "grouped")
    y_ref, grads_ref, ref_calls = run(torch.float32, "loop")
    assert calls >= 2 and ref_calls == 0  # grouped kernels ran (gate+up, down), the loop did not
    assert y.dtype == torch.bfloat16
    assert rel_rms(y, y_ref) <= 0.015
    for g, g_ref in zip(grads, grads_ref):
        assert rel_rms(g, g_ref) <= 0.015


# ----- flash SDPA against the explicit attention path ----------------------------------------


@pytest.mark.parametrize("n_heads, n_kv_heads", [(4, 4), (4, 2), (4, 1)])
def test_flash_sdpa_matches_explicit(n_heads: int, n_kv_heads: int) -> None:
    """One attention layer under bf16 autocast, SDPA restricted to the flash kernel (an
    unsupported call raises instead of falling back), against the explicit path that
    materialises the pattern, at 512 tokens, GQA included. One layer, not the whole model, so
    that no MoE routing flip downstream mixes into the comparison. Tolerance: relative RMS
    error <= 2% on the attention output (hook_z) and the layer output: both paths round to
    bf16, at different steps."""
    model = make_model(True, n_heads=n_heads, n_kv_heads=n_kv_heads, init_std=0.1)
    attn, hooks = model.blocks[1].attn, model.blocks[1].visits[1].attn  # a looped visit
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 512, SHAPE["d_model"], generator=gen).to(DEVICE)
    outs = {}
    for path in ("flash", "explicit"):
        with torch.no_grad(), torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            z = []
            handle = hooks.hook_z.register_forward_hook(lambda _m, _i, out: z.append(out))
            try:
                if path == "flash":
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        y = attn(x, hooks, model.rotary)
                else:
                    with model.explicit_attention():
                        y = attn(x, hooks, model.rotary)
            finally:
                handle.remove()
        outs[path] = (y, z[0])
    (y_f, z_f), (y_e, z_e) = outs["flash"], outs["explicit"]
    assert z_f.dtype == torch.bfloat16 and z_f.shape == (2, 512, n_heads, SHAPE["d_head"])
    assert rel_rms(z_f, z_e) <= 0.02
    assert rel_rms(y_f, y_e) <= 0.02


# ----- cached generation against recompute ---------------------------------------------------


@pytest.mark.parametrize("looped", [False, True], ids=["baseline", "smelt"])
def test_cached_generation_matches_recompute(looped: bool) -> None:
    """fp32 on the device: greedy decoding with the KV cache equals decoding that recomputes
    the whole prefix each step, token for token; and the cached step-by-step logits equal one
    full forward pass of the final sequence within 1e-4 relative RMS."""
    model = make_model(looped, n_loops=3, init_std=0.3) if looped else make_model(False)
    prompt = tokens(3, 9, seed=5)
    cached = model.generate(prompt, 24)
    recomputed = model.generate(prompt, 24, use_cache=False)
    assert torch.equal(cached, recomputed)
    assert len(set(cached[:, 9:].reshape(-1).tolist())) > 1  # not a degenerate repeat
    with torch.no_grad():
        full = model(cached)
        cache = KVCache()
        steps = [model(cached[:, :9], cache=cache)]
        steps += [model(cached[:, i : i + 1], cache=cache) for i in range(9, cached.shape[1])]
    assert rel_rms(torch.cat(steps, dim=1), full) <= 1e-4


def test_cached_bf16_forward_matches_full_forward() -> None:
    """Under bf16 autocast (how a GPU user decodes): cached chunked forward against the full
    forward. Every token goes to all experts (top-k = E), so no near-tied routing decision can
    flip between the two runs (with top-2 one flip moved the error to 2.7% here). Tolerance:
    relative RMS error <= 2% (different kernel shapes round differently; 0.15% measured)."""
    model = make_model(True, top_k=SHAPE["n_experts"])
    x = tokens(2, 64, seed=7)
    with torch.no_grad(), torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        full = model(x)
        cache = KVCache()
        parts = [model(x[:, :40], cache=cache), model(x[:, 40:48], cache=cache)]
        parts += [model(x[:, i : i + 1], cache=cache) for i in range(48, 64)]
    assert rel_rms(torch.cat(parts, dim=1), full) <= 0.02


# ----- probes, training step and resume on the device ------------------------------------------


def test_probe_on_the_device_takes_the_grouped_expert_path(monkeypatch) -> None:
    """A probe given a float32 model runs under the device's autocast (bf16 on CUDA), so the
    MoE takes the grouped kernels, not the per-expert loop (one host sync per expert per
    visit). On the CPU float32 already takes the grouped path."""
    from smelt_interp.probes import sink

    def refuse(*args, **kwargs):
        raise AssertionError("the per-expert loop ran")

    model = make_model(True)
    monkeypatch.setattr(Experts, "loop", refuse)
    x = tokens(2, 96, seed=3)
    x[:, 0] = model.cfg.bos_token_id
    with OpCounter("grouped_mm") as counter:
        heads = sink.measure(model, x)
    assert counter.count >= len(model.schedule)
    assert heads["sink_mass"].notna().all()


def _train_cfg(**over):
    from helpers.tiny_runs import TINY_RUN

    from smelt_interp.train.config import TrainConfig

    shape = {k: v for k, v in SHAPE.items() if k != "max_seq_len"}
    model = {**shape, "max_seq_len": 128}
    return TrainConfig.from_dict(
        {**TINY_RUN, "model": model, "device": DEVICE_NAME, "threads": 1, **over}
    )


def test_training_on_the_device_pins_batches_and_resumes() -> None:
    """Batches reach the device from pinned memory on CUDA; a run saved on the device resumes
    there (its CPU generator state restored on the CPU, the device's own on the device) and the
    resumed weights equal the saved ones. (A folder of its own, not pytest's tmp_path: the
    check runs this file alone, and pytest's clean-up of old numbered folders is not checked.)"""
    from smelt_interp.train.trainer import STATE_FILE, Trainer

    cfg = _train_cfg(steps=2, ckpt_every=1)
    with tempfile.TemporaryDirectory(prefix="smelt-cuda-test-") as tmp:
        trainer = Trainer(cfg, tmp, progress=False)
        built = trainer.batches.build(0, 0)
        assert all(g.tokens.is_pinned() == (DEVICE.type == "cuda") for g in built)
        trainer.run()
        saved = torch.load(Path(tmp) / STATE_FILE, map_location="cpu", weights_only=True)
        assert ("cuda" in saved["rng"]) == (DEVICE.type == "cuda")
        resumed = Trainer(cfg, tmp, resume=True, progress=False)
        assert resumed.try_resume() and resumed.step == 2
    assert torch.equal(torch.get_rng_state(), saved["rng"]["cpu"])
    for name, tensor in resumed.model.state_dict().items():
        assert tensor.device.type == DEVICE.type
        assert torch.equal(tensor.cpu(), saved["model"][name]), name


def test_gpu_presets_head_widths_against_torchs_own_eligibility_checks() -> None:
    """benchmarks.gpu_shapes' head-width rules against torch.backends.cuda's checks, on every
    GPU preset's Baseline and SMELT head width and on the even-only 44 (bf16, causal,
    [1, heads, 256, d_head], as many KV heads as query heads: the question is the width, not
    GQA). cuDNN is compared only where torch has it enabled. On the CPU the same SDPAParams are
    built but not checked: a CUDA build of torch asks the driver, and there is none."""
    from benchmarks.gpu_shapes import GPU_PRESETS, eligible_backends, preset_heads

    checks = {
        "efficient": torch.backends.cuda.can_use_efficient_attention,
        "flash": torch.backends.cuda.can_use_flash_attention,
    }
    if DEVICE.type == "cuda" and torch.backends.cuda.cudnn_sdp_enabled():
        checks["cudnn"] = torch.backends.cuda.can_use_cudnn_attention
    widths = {s["d_head"] for p in GPU_PRESETS for s in preset_heads(p).values()} | {44}
    assert widths == {32, 44, 48, 56, 64}
    for d_head in sorted(widths):
        q = torch.randn(1, 8, 256, d_head, device=DEVICE).bfloat16()
        params = torch.backends.cuda.SDPAParams(q, q, q, None, 0.0, True, False)
        rules = eligible_backends(d_head)
        assert rules["flash"] and rules["efficient"] == (d_head != 44)
        if DEVICE.type != "cuda":
            continue
        for name, check in checks.items():
            assert check(params, False) == rules[name], (name, d_head)
