"""GPU training throughput and model FLOPs utilisation (MFU) of the paper-scale preset.

MFU = tokens/s x training FLOPs per token / peak, where training FLOPs are 3x the forward count
of smelt_interp.budget (unembedding included) and the peak is a bf16 matmul measured here, on
this GPU, in the same run. Needs CUDA; on a machine without one it says so and exits.
`measure` is also what `benchmarks.gpu_check` calls (and runs on CPU too, for its tests).

python -m benchmarks.gpu_train [--preset paper-200m] [--steps 30] [--arch baseline|smelt|both]"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import Any

import torch

from smelt_interp.budget import flops_per_token, non_embedding_params
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import get_preset
from smelt_interp.train.trainer import Trainer


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels, so a timer read after it covers them (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_tflops(n: int = 8192, iters: int = 50, repeats: int = 3) -> float:
    """Measured bf16 dense matmul throughput on the current GPU, TFLOP/s: the best of
    `repeats` timed loops of `iters` n x n products (after a warm-up)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        torch.matmul(a, b, out=out)
    torch.cuda.synchronize()
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            torch.matmul(a, b, out=out)
        torch.cuda.synchronize()
        best = max(best, 2 * n**3 * iters / (time.perf_counter() - start) / 1e12)
    return best


def mfu(tokens_per_s: float, train_flops_per_token: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved training FLOP/s over the peak FLOP/s (a fraction)."""
    return tokens_per_s * train_flops_per_token / (peak_tflops * 1e12)


def train_flops_per_token(trainer: Trainer) -> float:
    """Forward FLOPs x 3 (forward + backward), unembedding included, at the run's length."""
    cfg = trainer.cfg
    return 3.0 * flops_per_token(trainer.model_cfg, cfg.seq_len, include_unembedding=True)


def measure(
    cfg: TrainConfig, steps: int, warmup: int = 3, deadline: float | None = None
) -> dict[str, Any]:
    """Train `cfg` (its device, its compile switch) for `warmup` untimed steps (compilation
    happens there), then up to `steps` timed optimizer steps. `deadline` is a time.monotonic()
    value: once it passes, no further step starts and the result says `truncated`; the
    figures then cover the steps that ran (None if no timed step ran)."""
    with tempfile.TemporaryDirectory(prefix="smelt-gpu-bench-") as out_dir:
        trainer = Trainer(cfg, out_dir, progress=False)  # writes nothing until asked
        device = trainer.device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        expired = lambda: deadline is not None and time.monotonic() >= deadline  # noqa: E731
        start = time.perf_counter()
        done_warmup = 0
        while done_warmup < warmup and not expired():
            trainer.train_step(cfg.lr)
            done_warmup += 1
        synchronize(device)
        warmup_s = time.perf_counter() - start
        start = time.perf_counter()
        timed, loss = 0, float("nan")
        while timed < steps and done_warmup == warmup and not expired():
            loss = trainer.train_step(cfg.lr)["loss"]
            timed += 1
        synchronize(device)
        seconds = time.perf_counter() - start
        tokens = trainer.tokens_per_step * timed
        return {
            "arch": cfg.arch,
            "device": str(device),
            "compile": cfg.compile,
            "warmup_steps": done_warmup,
            "warmup_s": warmup_s,
            "steps": timed,
            "seconds": seconds,
            "tokens": tokens,
            "tokens_per_s": tokens / seconds if timed else None,
            "loss": loss,
            "train_flops_per_token": train_flops_per_token(trainer),
            "params": non_embedding_params(trainer.model_cfg),
            "peak_memory_gib": (
                torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
            ),
            "truncated": timed < steps,
        }


def preset_config(preset: str, arch: str, compile_model: bool, device: str = "cuda") -> TrainConfig:
    """The preset's training config for one architecture on `device`."""
    return TrainConfig.from_dict(
        {**get_preset(preset), "arch": arch, "compile": compile_model, "device": device}
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="paper-200m")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--arch", default="both", choices=["baseline", "smelt", "both"])
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "no CUDA device: gpu_train needs a GPU (see benchmarks/README.md for recorded figures)"
        )
        return 0
    peak = matmul_peak_tflops()
    print(f"{torch.cuda.get_device_name()}: measured bf16 matmul peak {peak:.0f} TFLOP/s")
    for arch in ("baseline", "smelt") if args.arch == "both" else (args.arch,):
        cfg = preset_config(args.preset, arch, not args.no_compile)
        r = measure(cfg, args.steps, args.warmup)
        use = mfu(r["tokens_per_s"], r["train_flops_per_token"], peak)
        print(
            f"  {arch:8s} {r['params'] / 1e6:6.1f}M non-embedding params  "
            f"{r['tokens_per_s']:12,.0f} tokens/s  MFU {use:6.1%}  "
            f"peak memory {r['peak_memory_gib']:.1f} GiB  (warm-up {r['warmup_s']:.0f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
