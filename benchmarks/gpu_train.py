"""GPU training throughput and model FLOPs utilisation (MFU) of the paper-scale preset.

MFU = tokens/s x training FLOPs per token / peak, where training FLOPs are 3x the forward count
of smelt_interp.budget (unembedding included) and the peak is the H200's datasheet dense bf16
989 TFLOP/s; MFU against a bf16 matmul measured here, in the same run, is the second figure.
A compile that fails or runs past its share falls back to eager with the reason printed
(`prepare`); compile seconds are reported apart from step time. Needs CUDA; on a machine
without one it says so and exits. `interleaved` is what `gpu.check` calls (and,
like `measure`, runs on CPU too, for its tests).

python -m benchmarks.gpu_train [--preset paper-200m] [--steps 30] [--arch baseline|smelt|both]"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from smelt_interp.budget import flops_per_token, non_embedding_params
from smelt_interp.config import ModelConfig
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.device import resolve_device
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


# The H200's dense bf16 tensor-core peak, datasheet (no sparsity). An 8192-cube bf16 product
# measured 769-798 TFLOP/s on the lent H200s, so MFU against the measured rate reads ~1.25x
# higher; both are reported, this one first.
H200_DENSE_BF16_TFLOPS = 989.0


def mfu(tokens_per_s: float, train_flops_per_token: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved training FLOP/s over the peak FLOP/s (a fraction)."""
    return tokens_per_s * train_flops_per_token / (peak_tflops * 1e12)


def train_flops_per_token(model_cfg: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs x 3 (forward + backward), unembedding included, at the run's length."""
    return 3.0 * flops_per_token(model_cfg, seq_len, include_unembedding=True)


class CompileTimeout(Exception):
    """The first compiled step ran past its share of the budget."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise CompileTimeout in this (main) thread after `seconds` (None: no limit)."""
    if not seconds:
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise CompileTimeout(f"compiling took longer than its {seconds:.0f} s share")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Prepared:
    """A trainer past its first step: compiled (or eager after a failed compile)."""

    trainer: Trainer
    first_step_s: float  # the first step, compilation included
    fallback: str | None  # why compile was dropped, or None


def prepare(cfg: TrainConfig, out_dir: str, compile_budget_s: float | None = None) -> Prepared:
    """Build `cfg`'s trainer and run its first step. With `compile`, a compile that fails or
    runs past `compile_budget_s` is dropped, with the reason printed: the same model is
    rebuilt eager, so the check still measures something."""
    trainer = Trainer(cfg, out_dir, progress=False)  # writes nothing until asked
    start = time.perf_counter()
    try:
        with time_limit(compile_budget_s if cfg.runtime.compile else None):
            trainer.train_step(cfg.optim.lr)
            synchronize(trainer.device)
        return Prepared(trainer, time.perf_counter() - start, None)
    except Exception as exc:  # noqa: BLE001 - any compile failure falls back to eager
        if not cfg.runtime.compile:
            raise
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        print(f"  {cfg.arch}: compile dropped, running eager ({reason})", flush=True)
        trainer.batches.close()
        torch._dynamo.reset()
        eager = cfg.with_overrides({"compile": False})
        trainer = Trainer(eager, out_dir, progress=False)
        start = time.perf_counter()
        trainer.train_step(cfg.optim.lr)
        synchronize(trainer.device)
        return Prepared(trainer, time.perf_counter() - start, reason)


def timed_steps(trainer: Trainer, n: int) -> tuple[float, float]:
    """(seconds, last loss) of `n` optimizer steps with nothing read back in between."""
    synchronize(trainer.device)
    start = time.perf_counter()
    result = None
    for _ in range(n):
        result = trainer.train_step(trainer.cfg.optim.lr)
    synchronize(trainer.device)
    seconds = time.perf_counter() - start
    return seconds, (result["loss"] if result is not None else float("nan"))


def measure(
    cfg: TrainConfig,
    steps: int,
    warmup: int = 3,
    deadline: float | None = None,
    compile_budget_s: float | None = None,
) -> dict[str, Any]:
    """Train `cfg` (its device, its compile switch) for `warmup` untimed steps (compilation
    happens in the first: `compile_s` is that step's time over a warm step's), then up to
    `steps` timed optimizer steps. `deadline` is a time.monotonic() value: once it passes, no
    further step starts and the result says `truncated`; the figures then cover the steps that
    ran (None if no timed step ran)."""
    with tempfile.TemporaryDirectory(prefix="smelt-gpu-bench-") as out_dir:
        expired = lambda: deadline is not None and time.monotonic() >= deadline  # noqa: E731
        if expired():
            return _record(cfg, None, 0, 0.0, 0, 0.0, float("nan"), steps)
        device = resolve_device(cfg.runtime.device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        prepared = prepare(cfg, out_dir, compile_budget_s)
        trainer = prepared.trainer
        warm, warm_s = 1, prepared.first_step_s
        step_s = []
        while warm < warmup and not expired():
            step_s.append(timed_steps(trainer, 1)[0])
            warm += 1
        timed, seconds, loss = 0, 0.0, float("nan")
        while timed < steps and warm == warmup and not expired():
            s, loss = timed_steps(trainer, 1)
            seconds += s
            timed += 1
        trainer.batches.close()
        warm_s += sum(step_s)
        per_step = seconds / timed if timed else (min(step_s) if step_s else 0.0)
        out = _record(trainer.cfg, trainer, warm, warm_s, timed, seconds, loss, steps)
        out["compile_s"] = (
            max(prepared.first_step_s - per_step, 0.0) if cfg.runtime.compile else 0.0
        )
        out["compile_fallback"] = prepared.fallback
        return out


def _record(
    cfg: TrainConfig,
    trainer: Trainer | None,
    warm: int,
    warm_s: float,
    timed: int,
    seconds: float,
    loss: float,
    steps: int,
) -> dict[str, Any]:
    model_cfg = trainer.model_cfg if trainer is not None else cfg.model_config()
    device = trainer.device if trainer is not None else torch.device("cpu")
    tokens = cfg.tokens_per_step * timed
    return {
        "arch": cfg.arch,
        "device": str(device),
        "compile": cfg.runtime.compile,
        "warmup_steps": warm,
        "warmup_s": warm_s,
        "steps": timed,
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds if timed else None,
        "loss": loss,
        "train_flops_per_token": train_flops_per_token(model_cfg, cfg.batch.seq_len),
        "params": non_embedding_params(model_cfg),
        "peak_memory_gib": (
            torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        ),
        "truncated": timed < steps,
        "compile_s": 0.0,
        "compile_fallback": None,
    }


def interleaved(
    cfgs: dict[str, TrainConfig],
    rounds: int,
    steps_per_round: int,
    warmup: int = 3,
    deadline: float | None = None,
    compile_budget_s: float | None = None,
) -> dict[str, dict[str, Any]]:
    """Each config prepared (compiled, or eager after a fallback) and warmed up, then timed in
    alternating rounds of `steps_per_round` steps (A B, B A, A B, ...), so both models see the
    same clocks, temperature and neighbours; per model the record of `measure` over all its
    rounds, with each round's tokens/s. Stops starting rounds once `deadline` passes."""
    expired = lambda: deadline is not None and time.monotonic() >= deadline  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="smelt-gpu-bench-") as root:
        prepared = {a: prepare(c, f"{root}/{a}", compile_budget_s) for a, c in cfgs.items()}
        warm_s = {a: p.first_step_s for a, p in prepared.items()}
        for arch, p in prepared.items():
            warm_s[arch] += timed_steps(p.trainer, max(warmup - 1, 0))[0]
        rounds_s: dict[str, list[float]] = {a: [] for a in cfgs}
        loss = {a: float("nan") for a in cfgs}
        peaks: dict[str, float | None] = dict.fromkeys(cfgs)
        for r in range(rounds):
            if expired():
                break
            for arch in list(cfgs) if r % 2 == 0 else list(reversed(cfgs)):
                device = prepared[arch].trainer.device
                if device.type == "cuda":  # each model's own peak: reset before its rounds
                    torch.cuda.reset_peak_memory_stats(device)
                seconds, loss[arch] = timed_steps(prepared[arch].trainer, steps_per_round)
                rounds_s[arch].append(seconds)
                if device.type == "cuda":
                    peak = torch.cuda.max_memory_allocated(device) / 2**30
                    peaks[arch] = max(peaks[arch] or 0.0, peak)
        out = {}
        for arch, p in prepared.items():
            t = p.trainer
            done = len(rounds_s[arch]) * steps_per_round
            rec = _record(t.cfg, t, warmup, warm_s[arch], done, sum(rounds_s[arch]), loss[arch], 0)
            rec["truncated"] = len(rounds_s[arch]) < rounds
            # the peak during its own steps (the other model's weights and state stay resident)
            rec["peak_memory_gib"] = peaks[arch]
            step_s = sum(rounds_s[arch]) / done if done else 0.0
            rec["compile_s"] = (
                max(p.first_step_s - step_s, 0.0) if cfgs[arch].runtime.compile else 0.0
            )
            rec["compile_fallback"] = p.fallback
            rec["round_tokens_per_s"] = [
                t.tokens_per_step * steps_per_round / s for s in rounds_s[arch]
            ]
            out[arch] = rec
            t.batches.close()
        return out


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
        use = mfu(r["tokens_per_s"], r["train_flops_per_token"], H200_DENSE_BF16_TFLOPS)
        measured = mfu(r["tokens_per_s"], r["train_flops_per_token"], peak)
        print(
            f"  {arch:8s} {r['params'] / 1e6:6.1f}M non-embedding params  "
            f"{r['tokens_per_s']:12,.0f} tokens/s  MFU {use:6.1%} of "
            f"{H200_DENSE_BF16_TFLOPS:.0f} TFLOP/s ({measured:6.1%} of the measured peak)  "
            f"peak memory {r['peak_memory_gib']:.1f} GiB  (compile {r['compile_s']:.0f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
