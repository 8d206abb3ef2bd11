"""FSDP2 against DDP: training tokens/s of the same models on 2 CPU processes (gloo, one thread
each), side by side in one torchrun launch (interleaved rounds, median), as a ratio. FSDP2 gathers
each Block's weights before using them and reduce-scatters their gradients, where DDP all-reduces
gradients only; in exchange each rank holds 1/world of the weights and optimizer state.

python -m benchmarks.parallel_bench [--preset dyck-pair] [--steps N] [--rounds R] [--quick]
    [--results OUT.md]   (also write the report as a results file, smelt_interp.results)"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from smelt_interp.files import atomic_write_text
from smelt_interp.results import command_line, recording

REPO = Path(__file__).resolve().parents[1]
WORLD = 2
MODES = ("ddp", "fsdp")
ARCHS = ("baseline", "smelt")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="dyck-pair")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="dyck-pair-tiny, 2 rounds x 2 steps")
    p.add_argument("--results", metavar="OUT.md", help="also write the report as a results file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.preset, args.steps, args.rounds = "dyck-pair-tiny", 2, 2
    return args


def main(argv: list[str] | None = None) -> int:
    """Launch the worker under torchrun and print what its rank 0 reports."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.worker:
        return worker(args)
    title = f"FSDP2 against DDP, preset {args.preset}"
    with recording(title, command_line("benchmarks.parallel_bench", argv)) as record:
        code = launch(args)
    if args.results and code == 0:
        print(f"wrote {atomic_write_text(args.results, record.text)}")
    return code


def launch(args: argparse.Namespace) -> int:
    """Run the worker under torchrun and print what its rank 0 reports."""
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    command = [
        exe,
        "--standalone",
        "--nproc-per-node",
        str(WORLD),
        "-m",
        "benchmarks.parallel_bench",
    ]
    command += ["--worker", "--preset", args.preset, "--steps", str(args.steps)]
    command += ["--rounds", str(args.rounds)]
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": path}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    print(proc.stdout, end="", flush=True)
    if proc.returncode:
        print(proc.stderr[-3000:], file=sys.stderr)
    return proc.returncode


def time_steps(trainer, steps: int) -> float:
    """Seconds for `steps` optimizer steps on every rank (barriers around them)."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(trainer.cfg.optim.lr)
    dist.barrier()
    return time.perf_counter() - start


def worker(args: argparse.Namespace) -> int:
    """One rank: a DDP and an FSDP trainer per architecture, one warm-up step each, then
    `rounds` interleaved rounds of `steps` steps (timed between barriers)."""
    from benchmarks.train_bench import interleaved_seconds
    from smelt_interp.train.config import TrainConfig
    from smelt_interp.train.parallel import local
    from smelt_interp.train.presets import get_preset
    from smelt_interp.train.trainer import Trainer

    trainers = {}
    for arch in ARCHS:
        for mode in MODES:
            over = {"arch": arch, "parallel": mode, "threads": 1, "device": "cpu"}
            cfg = TrainConfig.from_dict({**get_preset(args.preset), **over})
            trainers[arch, mode] = Trainer(cfg, "/tmp/smelt-parallel-bench", progress=False)
    _, seconds = interleaved_seconds(trainers, args.steps, args.rounds, timer=time_steps)
    if dist.get_rank() != 0:
        return 0
    print(
        f"FSDP2 vs DDP, preset {args.preset}, {WORLD} CPU processes x 1 thread (gloo), "
        f"{args.rounds} rounds x {args.steps} steps (median)"
    )
    for arch in ARCHS:
        rates, held = {}, {}
        for mode in MODES:
            trainer = trainers[arch, mode]
            tokens = trainer.tokens_per_step * args.steps
            rates[mode] = tokens / seconds[arch, mode]
            params = list(trainer.model.parameters())
            held[mode] = sum(local(p).numel() for p in params) / sum(p.numel() for p in params)
        print(
            f"  {arch:8s}  ddp {rates['ddp']:9,.0f} tokens/s   fsdp {rates['fsdp']:9,.0f} "
            f"tokens/s   FSDP/DDP {rates['fsdp'] / rates['ddp']:.2f}   weights held per rank: "
            f"ddp {held['ddp']:.0%}, fsdp {held['fsdp']:.0%}"
        )
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    raise SystemExit(main(sys.argv[1:]))
