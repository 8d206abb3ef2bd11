"""GPU training throughput and model FLOPs utilisation (MFU) of the paper-scale preset.

MFU = tokens/s x training FLOPs per token / peak, where training FLOPs are 3x the forward count
of smelt_interp.budget (unembedding included) and the peak is a bf16 matmul measured here, on
this GPU, in the same run. Needs CUDA; on a machine without one it says so and exits.

python -m benchmarks.gpu_train [--preset paper-200m] [--steps 30] [--arch baseline|smelt|both]"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from smelt_interp.budget import flops_per_token, non_embedding_params
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import get_preset
from smelt_interp.train.trainer import Trainer


def matmul_peak_tflops(n: int = 8192, iters: int = 20) -> float:
    """Measured bf16 dense matmul throughput, TFLOP/s."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - start) / 1e12


def measure(arch: str, preset: str, steps: int, compile_model: bool) -> dict[str, float]:
    cfg = TrainConfig.from_dict(
        {**get_preset(preset), "arch": arch, "compile": compile_model, "device": "cuda"}
    )
    trainer = Trainer(cfg, f"/tmp/smelt-gpu-bench/{arch}", progress=False)
    for _ in range(3):  # warm-up and compilation
        trainer.train_step(cfg.lr)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(cfg.lr)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens_per_s = cfg.tokens_per_step * steps / seconds
    train_flops = 3 * flops_per_token(trainer.model_cfg, cfg.seq_len, include_unembedding=True)
    return {
        "tokens_per_s": tokens_per_s,
        "train_flops_per_token": train_flops,
        "params": non_embedding_params(trainer.model_cfg),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="paper-200m")
    p.add_argument("--steps", type=int, default=30)
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
        r = measure(arch, args.preset, args.steps, not args.no_compile)
        mfu = r["tokens_per_s"] * r["train_flops_per_token"] / (peak * 1e12)
        print(
            f"  {arch:8s} {r['params'] / 1e6:6.1f}M non-embedding params  "
            f"{r['tokens_per_s']:12,.0f} tokens/s  MFU {mfu:6.1%}  "
            f"peak memory {r['peak_memory_gib']:.1f} GiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
