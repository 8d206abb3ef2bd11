"""Training throughput of the default pair on this machine: Baseline vs its budget-matched SMELT,
measured side by side (interleaved rounds, median), as a ratio. The paper matches FLOPs, so
tokens/s should be close; the SMELT model runs 1.5x the layers at a narrower width, so per-layer
overheads (kernel launches, norms, routing) weigh more on it.

python -m benchmarks.train_bench [--steps N] [--rounds R] [--preset dyck-pair]"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from smelt_interp.budget import Budget
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import get_preset
from smelt_interp.train.trainer import Trainer


def time_steps(trainer: Trainer, steps: int) -> float:
    """Seconds for `steps` optimizer steps (after the first, warm-up step)."""
    trainer.train_step(trainer.cfg.lr)
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(trainer.cfg.lr)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="dyck-pair")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="2 rounds x 2 steps")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 2, 2
    torch.set_num_threads(args.threads)
    trainers = {}
    for arch in ("baseline", "smelt"):
        cfg = TrainConfig.from_dict(
            {**get_preset(args.preset), "arch": arch, "threads": args.threads}
        )
        trainers[arch] = Trainer(cfg, f"/tmp/smelt-train-bench/{arch}", progress=False)
    times: dict[str, list[float]] = {a: [] for a in trainers}
    for _ in range(args.rounds):
        for arch, trainer in trainers.items():
            times[arch].append(time_steps(trainer, args.steps))
    print(
        f"training throughput, preset {args.preset}, {args.threads} threads, "
        f"{args.rounds} rounds x {args.steps} steps (median)"
    )
    rates = {}
    for arch, trainer in trainers.items():
        tokens = trainer.cfg.tokens_per_step * args.steps
        rates[arch] = tokens / statistics.median(times[arch])
        b = Budget.of(trainer.model_cfg, trainer.cfg.seq_len)
        print(
            f"  {arch:8s} {rates[arch]:9,.0f} tokens/s   forward FLOPs/token {b.flops:,.0f}   "
            f"effective depth {trainer.model_cfg.effective_depth}"
        )
    print(f"  SMELT / Baseline tokens/s ratio: {rates['smelt'] / rates['baseline']:.3f}")


if __name__ == "__main__":
    main()
