"""The measurements of benchmarks.gpu_perf, one function per part, each returning plain JSON data
and calling `emit` with what it has after every model or backend, so a part killed at its
deadline keeps what finished. Every function runs on the CPU too (the `--smoke` sizes); a
quantity only a GPU has is None, with the reason under `null_reasons`."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from smelt_interp.config import ModelConfig
from smelt_interp.model.kernels import SDPA_BACKENDS, KernelOptions, sdpa_backend

Emit = Callable[[dict[str, Any]], None]
NO_CUDA = "no CUDA device (CPU smoke run)"
DATASHEET_TFLOPS = {"H100": 989.0, "H200": 989.0}  # dense bf16, no sparsity (SXM)
# The A/B's variants: the code as it is, each switch alone, and all of them together.
VARIANTS: dict[str, dict[str, Any]] = {
    "current": {},
    "moe_gather": {"moe_gather": True},
    "weight_cache": {"weight_cache": True},
    "fused_qkv": {"fused_qkv": True},
    "sdpa_cudnn_first": {"sdpa_priority": ("cudnn", "flash")},
    "all": {
        "moe_gather": True, "weight_cache": True, "fused_qkv": True,
        "sdpa_priority": ("cudnn", "flash"),
    },
}  # fmt: skip
# Kernel categories of the profile, first match wins (CUDA kernel names, or aten ops on a CPU).
CATEGORIES = (
    ("optimizer", r"adam|multi_tensor|foreach|optimizer"),
    ("attention", r"flash|fmha|attention|sdpa|cudnn.*(mha|attn)|_efficient_attention"),
    ("grouped_gemm", r"grouped|group_gemm|_grouped_mm|smelt::grouped"),
    ("dense_gemm", r"gemm|xmma|cublas|cutlass|matmul|\bmm\b|aten::mm|addmm|linear|bmm"),
    ("permutation", r"index|gather|scatter|sort|searchsorted|radix|aten::cat|cat_|arange|nonzero"),
    ("norms_pointwise", r"norm|elementwise|vectorized|silu|mul|add|softmax|reduce|copy|to_copy|"
     r"triton|sum|exp|rsqrt|roll|fill|where|neg|div|pow"),
)  # fmt: skip


def device_of(smoke: bool) -> torch.device:
    return torch.device("cpu" if smoke else "cuda")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device) -> torch.autocast:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def timed(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Seconds per call of `fn`: the median of `repeats` timed calls after `warmup`."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


# ----- env ------------------------------------------------------------------------------------


def env_part(emit: Emit, smoke: bool) -> dict[str, Any]:
    """Versions, the GPU, its SM count and clocks (NVML), and a measured bf16 matmul peak."""
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "null_reasons": {},
    }
    keys = ("gpu", "sm_count", "sm_clock_mhz", "max_sm_clock_mhz", "memory_clock_mhz")
    if smoke or not torch.cuda.is_available():
        out.update(dict.fromkeys((*keys, "matmul_peak_tflops", "datasheet_tflops")))
        out["null_reasons"] = dict.fromkeys(
            (*keys, "matmul_peak_tflops", "datasheet_tflops"), NO_CUDA
        )
        for key in ("cuda", "cudnn"):
            if out[key] is None:
                out["null_reasons"][key] = "this torch has no CUDA build"
        emit(out)
        return out
    props = torch.cuda.get_device_properties(0)
    out.update(gpu=props.name, sm_count=props.multi_processor_count)
    out.update(_clocks(out["null_reasons"]))
    out["datasheet_tflops"] = next(
        (v for k, v in DATASHEET_TFLOPS.items() if k in props.name), None
    )
    if out["datasheet_tflops"] is None:
        out["null_reasons"]["datasheet_tflops"] = f"no datasheet peak on file for {props.name}"
    emit(out)
    from benchmarks.gpu_train import matmul_peak_tflops

    out["matmul_peak_tflops"] = matmul_peak_tflops()
    emit(out)
    return out


def _clocks(reasons: dict[str, str]) -> dict[str, Any]:
    keys = ("sm_clock_mhz", "max_sm_clock_mhz", "memory_clock_mhz")
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return {
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "memory_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        }
    except Exception as exc:  # noqa: BLE001 - clocks are optional figures
        reasons.update(dict.fromkeys(keys, f"NVML: {type(exc).__name__}: {exc}"))
        return dict.fromkeys(keys)


# ----- attention ------------------------------------------------------------------------------


def attention_flops(b: int, h: int, t: int, d: int) -> float:
    """Causal attention's forward + backward FLOPs: QK^T and PV at 2 t^2 d each per head, half
    of them under the causal mask, the backward 2.5x the forward."""
    return 3.5 * 2 * 2 * b * h * t * t * d / 2


def attention_part(
    emit: Emit, shapes: dict[str, tuple[ModelConfig, int, int]], smoke: bool
) -> dict[str, Any]:
    """Per model: the backend its shape takes by default, then forward + backward time and
    TFLOP/s under each backend alone (skipped, with the reason, where it cannot run)."""
    device = device_of(smoke)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    names = ("flash", "cudnn", "efficient", "math")
    out: dict[str, Any] = {"models": {}}
    for arch, (cfg, batch, seq_len) in shapes.items():
        gen = torch.Generator(device=device).manual_seed(0)
        shape = (batch, cfg.n_heads, seq_len, cfg.d_head)
        q = torch.randn(shape, device=device, dtype=dtype, generator=gen).requires_grad_()
        kv_shape = (batch, cfg.n_kv_heads, seq_len, cfg.d_head)
        k = torch.randn(kv_shape, device=device, dtype=dtype, generator=gen).requires_grad_()
        v = torch.randn(kv_shape, device=device, dtype=dtype, generator=gen).requires_grad_()
        flops = attention_flops(batch, cfg.n_heads, seq_len, cfg.d_head)
        rec: dict[str, Any] = {
            "q_shape": list(shape),
            "kv_shape": list(kv_shape),
            "dtype": str(dtype).removeprefix("torch."),
            "default_backend": sdpa_backend(q, k, v, is_causal=True),
            "flops": flops,
            "backends": {},
        }
        for name in names:
            with sdpa_kernel([SDPA_BACKENDS[name]]):
                if sdpa_backend(q, k, v, is_causal=True) != name:
                    rec["backends"][name] = {"skipped": f"{name} cannot run this shape here"}
                    continue

                def step() -> None:
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    o.sum().backward()

                try:
                    seconds = timed(step, device, repeats=3 if smoke else 10)
                except RuntimeError as exc:
                    rec["backends"][name] = {"skipped": f"{type(exc).__name__}: {exc}"[:300]}
                    continue
            rec["backends"][name] = {"seconds": seconds, "tflops": flops / seconds / 1e12}
        out["models"][arch] = rec
        emit(out)
    return out


# ----- experts --------------------------------------------------------------------------------


def realistic_routing(n: int, cfg: ModelConfig, gen: torch.Generator, device: torch.device):
    """Top-k routing with uneven loads, as trained routers have: logits around a per-expert
    bias drawn from a Dirichlet(1) mix. Returns indices [n, k], weights [n, k], load max/mean."""
    share = torch.distributions.Dirichlet(torch.ones(cfg.n_experts)).sample()
    logits = torch.randn(n, cfg.n_experts, generator=gen) + share.log()
    probs = logits.softmax(-1)
    weights, indices = probs.topk(cfg.top_k, dim=-1)
    load = torch.bincount(indices.reshape(-1), minlength=cfg.n_experts).float()
    weights = weights / weights.sum(-1, keepdim=True)
    return indices.to(device), weights.to(device), float(load.max() / load.mean())


def experts_part(
    emit: Emit, shapes: dict[str, tuple[ModelConfig, int, int]], smoke: bool
) -> dict[str, Any]:
    """Per model: the grouped expert chain (gate/up, SwiGLU, down, combine) forward + backward
    on one micro-batch's tokens with uneven routing, as it is and under the MoE switches."""
    from smelt_interp.model.moe import Experts

    device = device_of(smoke)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    out: dict[str, Any] = {"models": {}}
    for arch, (cfg, batch, seq_len) in shapes.items():
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(0)
        n = batch * seq_len
        experts = Experts(cfg).to(device)
        for p in experts.parameters():
            torch.nn.init.normal_(p, std=0.02)
        indices, weights, imbalance = realistic_routing(n, cfg, gen, device)
        x = torch.randn(n, cfg.d_model, device=device).to(dtype).requires_grad_()
        flops = 3 * 2 * n * cfg.top_k * 3 * cfg.d_model * cfg.d_expert
        rec: dict[str, Any] = {"tokens": n, "load_max_over_mean": imbalance, "flops": flops}
        variants = {"current": {}, "moe_gather": {"moe_gather": True}}
        variants["weight_cache"] = {"weight_cache": True}
        for name, options in variants.items():
            KernelOptions(**options).apply(experts)

            def step() -> None:
                experts(x, indices, weights).float().sum().backward()

            seconds = timed(step, device, repeats=3 if smoke else 10)
            rec[name] = {"seconds": seconds, "tflops": flops / seconds / 1e12}
        out["models"][arch] = rec
        emit(out)
    return out


# ----- training steps (profile and A/B) ---------------------------------------------------------


class Stepper:
    """One model and its AdamW, stepping on random tokens: `micro` micro-batches, then a step."""

    def __init__(
        self, cfg: ModelConfig, batch: int, seq_len: int, device: torch.device, micro: int
    ):
        from smelt_interp.model.transformer import SmeltModel  # TransformerLens: slow import

        torch.manual_seed(0)
        self.model = SmeltModel(cfg).to(device).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        gen = torch.Generator().manual_seed(1)
        self.tokens = torch.randint(0, 256, (batch, seq_len), generator=gen).to(device)
        self.device, self.micro = device, micro

    def step(self) -> None:
        for _ in range(self.micro):
            with autocast(self.device):
                logits = self.model(self.tokens, ids_checked=True)
                loss = F.cross_entropy(
                    logits[:, :-1].flatten(0, 1).float(), self.tokens[:, 1:].flatten()
                )
            (loss + 0.01 * self.model.aux_losses["load_balance"]).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def profile_part(
    emit: Emit, shapes: dict[str, tuple[ModelConfig, int, int]], smoke: bool
) -> dict[str, Any]:
    """Per model: torch.profiler over two training steps (after one warm-up step): time by
    kernel category, the top 15 kernels and the GPU-busy fraction (CPU ops on a CPU)."""
    from torch.profiler import ProfilerActivity, profile

    device = device_of(smoke)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    out: dict[str, Any] = {"events": "cuda kernels" if device.type == "cuda" else "cpu ops"}
    out["models"] = {}
    for arch, (cfg, batch, seq_len) in shapes.items():
        stepper = Stepper(cfg, batch, seq_len, device, micro=1)
        stepper.step()
        sync(device)
        start = time.perf_counter()
        with profile(activities=activities) as prof:
            for _ in range(2):
                stepper.step()
            sync(device)
        wall = time.perf_counter() - start
        out["models"][arch] = _profile_record(prof, device, wall)
        del stepper
        emit(out)
    return out


def _profile_record(prof: Any, device: torch.device, wall_s: float) -> dict[str, Any]:
    if device.type == "cuda":
        events = list(prof.events())
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        rows = [
            (e.name, e.time_range.elapsed_us() / 1e6, e.time_range.start, e.time_range.end)
            for e in kernels
        ]
        if events:  # the profiled span, host and device, in the profiler's microseconds
            start = min(e.time_range.start for e in events)
            wall_s = (max(e.time_range.end for e in events) - start) / 1e6
    else:  # self time of aten ops: a CPU runs its kernels inside them
        rows = [
            (e.key, e.self_cpu_time_total / 1e6, None, None)
            for e in prof.key_averages()
            if e.key.startswith(("aten::", "smelt::")) and e.self_cpu_time_total > 0
        ]
    by_category: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for name, seconds, _, _ in rows:
        by_category[category(name)] = by_category.get(category(name), 0.0) + seconds
        by_name[name] = by_name.get(name, 0.0) + seconds
    total = sum(by_category.values()) or 1.0
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:15]
    rec: dict[str, Any] = {
        "wall_s": wall_s,
        "kernel_s": total,
        "categories": {
            k: {"seconds": v, "share": v / total} for k, v in sorted(by_category.items())
        },
        "top_kernels": [
            {"name": n[:160], "seconds": s, "category": category(n), "share": s / total}
            for n, s in top
        ],
        "gpu_busy_fraction": None,
        "null_reasons": {},
    }
    if device.type == "cuda" and rows:
        rec["gpu_busy_fraction"] = _busy(rows) / (wall_s * 1e6)
    else:
        rec["null_reasons"]["gpu_busy_fraction"] = NO_CUDA
    return rec


def _busy(rows: list[tuple[str, float, Any, Any]]) -> float:
    """Microseconds covered by at least one kernel (the union of their intervals)."""
    spans = sorted((s, e) for _, _, s, e in rows)
    busy, end = 0.0, float("-inf")
    for s, e in spans:
        if s > end:
            busy, end = busy + e - s, e
        elif e > end:
            busy, end = busy + e - end, e
    return busy


# ----- A/B ------------------------------------------------------------------------------------


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def ab_part(
    emit: Emit,
    shapes: dict[str, tuple[ModelConfig, int, int]],
    smoke: bool,
    budget_s: float,
    datasheet_tflops: float | None = None,
) -> dict[str, Any]:
    """Per model, one at a time (its peak memory reset before it is built): every variant of
    VARIANTS on the same weights, in interleaved rounds (the order reversed each round) until
    the model's share of `budget_s` is spent; tokens/s, each variant's ratio to `current` per
    round and its median, peak memory per variant and per model, and MFU."""
    from benchmarks.gpu_train import train_flops_per_token

    device = device_of(smoke)
    out: dict[str, Any] = {"variants": {k: _plain(v) for k, v in VARIANTS.items()}, "models": {}}
    out["datasheet_tflops"] = datasheet_tflops
    out["null_reasons"] = {} if datasheet_tflops else {"datasheet_tflops": NO_CUDA}
    share = budget_s / len(shapes)
    for arch, (cfg, batch, seq_len) in shapes.items():
        deadline = time.monotonic() + share
        if device.type == "cuda":
            torch.cuda.empty_cache()
        reset_peak(device)
        stepper = Stepper(cfg, batch, seq_len, device, micro=2)
        tokens = 2 * batch * seq_len
        stepper.step()  # warm-up: kernels chosen, caches allocated
        model_peak = peak_gib(device)  # built and stepped once, since the reset above
        seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
        peaks: dict[str, float | None] = dict.fromkeys(VARIANTS)
        order = list(VARIANTS)
        rounds = 0
        while rounds < 1 or (time.monotonic() < deadline and rounds < 20):
            for name in order if rounds % 2 == 0 else order[::-1]:
                KernelOptions(**VARIANTS[name]).apply(stepper.model)
                if rounds == 0:
                    stepper.step()  # this variant's own warm-up
                reset_peak(device)
                seconds[name].append(timed(stepper.step, device, repeats=1, warmup=0))
                peak = peak_gib(device)
                if peak is not None:
                    peaks[name] = max(peaks[name] or 0.0, peak)
            rounds += 1
        flops = train_flops_per_token(cfg, seq_len)
        rec: dict[str, Any] = {"rounds": rounds, "tokens_per_step": tokens, "variants": {}}
        for name, times in seconds.items():
            ratios = [c / s for c, s in zip(seconds["current"], times)]
            tps = tokens * len(times) / sum(times)
            rec["variants"][name] = {
                "tokens_per_s": tps,
                "round_tokens_per_s": [tokens / s for s in times],
                "speedup_vs_current": sorted(ratios)[len(ratios) // 2],
                "peak_memory_gib": peaks[name],
                "mfu": tps * flops / (datasheet_tflops * 1e12) if datasheet_tflops else None,
            }
        known = [p for p in (model_peak, *peaks.values()) if p is not None]
        rec["peak_memory_gib"] = max(known) if known else None
        rec["train_flops_per_token"] = flops
        rec["null_reasons"] = {} if device.type == "cuda" else {
            "peak_memory_gib": NO_CUDA, "mfu": "no datasheet peak (CPU smoke run)"
        }  # fmt: skip
        out["models"][arch] = rec
        del stepper
        emit(out)
    models = out["models"]
    if {"baseline", "smelt"} <= set(models):
        out["smelt_over_baseline"] = {
            v: models["smelt"]["variants"][v]["tokens_per_s"]
            / models["baseline"]["variants"][v]["tokens_per_s"]
            for v in VARIANTS
        }
        emit(out)
    return out


def _plain(options: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}
