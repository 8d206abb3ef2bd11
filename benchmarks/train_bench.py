"""Training throughput of the default pair on this machine: Baseline vs its budget-matched SMELT,
each eager and compiled (torch.compile, inductor), measured side by side in one process
(interleaved rounds, median), with the SMELT / Baseline ratio for each mode and the compiled /
eager speed-up for each model. The paper matches FLOPs, so tokens/s should be close; SMELT runs
1.5x the layer visits at a narrower width, so per-visit overheads weigh more on it.

python -m benchmarks.train_bench [--steps N] [--rounds R] [--preset dyck-pair] [--threads 2]
  --profile     the top operators of an eager and a compiled SMELT step (torch.profiler,
                self CPU time)
  --contended   eager SMELT with a second CPU-bound process beside it, under the OpenMP default
                wait policy and under PASSIVE, and on an idle machine for the cost of PASSIVE
                (each in its own process: the policy is read when torch loads)
  --results OUT.md  also write the report as a results file (smelt_interp.results: the command
                and the commit that measured it), for the README to cite"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import TypeVar

import torch

from smelt_interp.budget import Budget
from smelt_interp.files import atomic_write_text
from smelt_interp.results import command_line, recording
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import get_preset
from smelt_interp.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
MODES = ("eager", "compiled")
ARCHS = ("baseline", "smelt")
Key = TypeVar("Key", bound=Hashable)


def build(preset: str, arch: str, threads: int, compile_model: bool) -> Trainer:
    cfg = TrainConfig.from_dict(
        {**get_preset(preset), "arch": arch, "threads": threads, "compile": compile_model}
    )
    mode = "compiled" if compile_model else "eager"
    return Trainer(cfg, f"/tmp/smelt-train-bench/{arch}-{mode}", progress=False)


def time_steps(trainer: Trainer, steps: int) -> float:
    """Seconds for `steps` optimizer steps."""
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(trainer.cfg.optim.lr)
    return time.perf_counter() - start


def interleaved_rounds(
    trainers: Mapping[Key, Trainer],
    steps: int,
    rounds: int,
    timer: Callable[[Trainer, int], float] = time_steps,
) -> tuple[dict[Key, float], dict[Key, list[float]]]:
    """(seconds of each trainer's first step, which compiles a compiled one; seconds of `steps`
    steps in each of `rounds` rounds in which the trainers take turns, so machine noise falls on
    all of them alike). `timer` times one trainer's steps."""
    warmup = {key: timer(trainer, 1) for key, trainer in trainers.items()}
    times: dict[Key, list[float]] = {key: [] for key in trainers}
    for _ in range(rounds):
        for key, trainer in trainers.items():
            times[key].append(timer(trainer, steps))
    return warmup, times


def interleaved_seconds(
    trainers: Mapping[Key, Trainer],
    steps: int,
    rounds: int,
    timer: Callable[[Trainer, int], float] = time_steps,
) -> tuple[dict[Key, float], dict[Key, float]]:
    """`interleaved_rounds` with each trainer's rounds reduced to their median."""
    warmup, times = interleaved_rounds(trainers, steps, rounds, timer)
    return warmup, {key: statistics.median(t) for key, t in times.items()}


def round_ratio_range(numerator: list[float], denominator: list[float]) -> tuple[float, float]:
    """Lowest and highest of numerator[r] / denominator[r] over the rounds r (two rates measured
    back to back in each round): how far machine noise moves a ratio within one run."""
    ratios = [n / d for n, d in zip(numerator, denominator, strict=True)]
    return min(ratios), max(ratios)


def throughput(args: argparse.Namespace) -> None:
    """Eager and compiled tokens/s of both models, in interleaved rounds."""
    trainers = {
        (arch, mode): build(args.preset, arch, args.threads, mode == "compiled")
        for arch in ARCHS
        for mode in MODES
    }
    warmup, per_round = interleaved_rounds(trainers, args.steps, args.rounds)
    tokens = {key: t.cfg.tokens_per_step * args.steps for key, t in trainers.items()}
    rates = {key: tokens[key] / statistics.median(t) for key, t in per_round.items()}
    round_rates = {key: [tokens[key] / s for s in t] for key, t in per_round.items()}
    print(
        f"training throughput, preset {args.preset}, {args.threads} threads, "
        f"{args.rounds} rounds x {args.steps} steps (median), torch {torch.__version__}"
    )
    print(f"  {'':16s} {'eager tok/s':>12s} {'compiled tok/s':>15s} {'compiled/eager':>15s}"
          f" {'(per round)':>13s} {'first compiled step':>20s}")  # fmt: skip
    for arch in ARCHS:
        eager, compiled = rates[arch, "eager"], rates[arch, "compiled"]
        low, high = round_ratio_range(round_rates[arch, "compiled"], round_rates[arch, "eager"])
        print(
            f"  {arch:16s} {eager:12,.0f} {compiled:15,.0f} {compiled / eager:14.2f}x"
            f" {f'{low:.2f}-{high:.2f}':>13s} {warmup[arch, 'compiled']:18.1f} s"
        )
    ratio = {m: rates["smelt", m] / rates["baseline", m] for m in MODES}
    spread = {
        m: round_ratio_range(round_rates["smelt", m], round_rates["baseline", m]) for m in MODES
    }
    print(f"  {'SMELT / Baseline':16s} {ratio['eager']:12.3f} {ratio['compiled']:15.3f}")
    span = {m: f"{spread[m][0]:.3f}-{spread[m][1]:.3f}" for m in MODES}
    print(f"  {'  (per round)':16s} {span['eager']:>12s} {span['compiled']:>15s}")
    print(
        "  per round: the lowest and highest ratio over the rounds, each measured on trainers "
        "run back to back"
    )
    for arch in ARCHS:
        trainer = trainers[arch, "eager"]
        b = Budget.of(trainer.model_cfg, trainer.cfg.batch.seq_len)
        print(
            f"  {arch}: forward FLOPs/token {b.flops:,.0f}, "
            f"effective depth {trainer.model_cfg.effective_depth}"
        )
    for arch in ARCHS:
        cfg = trainers[arch, "eager"].cfg  # the preset's whole run, at the rates above
        steps = cfg.schedule.steps
        run_tokens = cfg.tokens_per_step * steps
        minutes = {m: run_tokens / rates[arch, m] / 60 for m in MODES}
        print(
            f"  {arch}: the preset's {steps:,} steps ({run_tokens:,} tokens) at these rates: "
            f"{minutes['eager']:.1f} min eager, {minutes['compiled']:.1f} min compiled "
            f"(optimizer steps only)"
        )


def profile(args: argparse.Namespace, top: int = 15) -> None:
    """Top operators (self CPU time) over `args.steps` SMELT steps, eager then compiled."""
    import torch._inductor.config as inductor_config

    inductor_config.cpp.enable_kernel_profile = True  # name the generated kernels in the profile
    for mode in MODES:
        trainer = build(args.preset, "smelt", args.threads, compile_model=mode == "compiled")
        time_steps(trainer, 2)  # compile and warm up
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            seconds = time_steps(trainer, args.steps)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        print(
            f"profile of {args.steps} {mode} SMELT steps, preset {args.preset}, "
            f"{args.threads} threads, {seconds / args.steps * 1e3:.0f} ms/step under the "
            f"profiler: top {top} operators by self CPU time (total {total / 1e6:.2f} s)"
        )
        ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
        for e in ranked:
            share = e.self_cpu_time_total / total
            print(
                f"  {share:6.1%} {e.self_cpu_time_total / 1e3 / args.steps:9.1f} ms/step "
                f"{e.count // args.steps:5d} calls/step  {e.key[:90]}"
            )


# ----- contention: the OpenMP wait policy ------------------------------------------------
def worker(preset: str, threads: int, steps: int) -> None:
    """One measurement in a fresh process: eager SMELT tokens/s, printed as `RATE <float>`."""
    trainer = build(preset, "smelt", threads, compile_model=False)
    time_steps(trainer, 1)
    seconds = time_steps(trainer, steps)
    print(f"RATE {trainer.cfg.tokens_per_step * steps / seconds}", flush=True)


# The OpenMP settings --contended compares: the runtime's default (spin about 300,000 times,
# then sleep), PASSIVE (sleep at once: smelt_interp's default) and short spins before sleeping.
WAIT_SETTINGS: dict[str, dict[str, str]] = {
    "(unset)": {},
    "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "GOMP_SPINCOUNT=1000": {"GOMP_SPINCOUNT": "1000"},
    "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
}


def _measure_in_subprocess(args: argparse.Namespace, setting: dict[str, str], busy: bool) -> float:
    """Run `worker` in a new process with the OpenMP variables of `setting` (no others; torch is
    imported before smelt_interp could set its default), beside a busy Python loop when `busy`."""
    dropped = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(setting)
    code = (
        "import torch\n"  # loads OpenMP before the package's default applies
        "from benchmarks.train_bench import worker\n"
        f"worker({args.preset!r}, {args.threads}, {args.steps})\n"
    )
    contender = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
        )
    finally:
        if contender is not None:
            contender.kill()
            contender.wait()
    for line in out.stdout.splitlines():
        if line.startswith("RATE "):
            return float(line.split()[1])
    raise SystemExit(f"contended worker failed: {out.stderr.strip().splitlines()[-1:]}")


def contended(args: argparse.Namespace) -> None:
    print(
        f"eager SMELT training, preset {args.preset}, {args.threads} threads, {args.steps} steps "
        f"per run, each run in a fresh process; busy = one Python busy loop beside it"
    )
    rates = {}
    for busy in (False, True):
        for label, setting in WAIT_SETTINGS.items():
            rates[label, busy] = _measure_in_subprocess(args, setting, busy)
            state = "busy" if busy else "idle"
            print(f"  {state:5s} {label:27s} {rates[label, busy]:9,.0f} tokens/s", flush=True)
    print(f"  {'':33s} {'idle':>7s} {'busy':>7s}   (tokens/s against the runtime's default)")
    for label in WAIT_SETTINGS:
        ratios = [rates[label, busy] / rates["(unset)", busy] for busy in (False, True)]
        print(f"  {label:33s} {ratios[0]:6.2f}x {ratios[1]:6.2f}x")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="dyck-pair")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="2 rounds x 2 steps")
    p.add_argument("--profile", action="store_true", help="profile eager and compiled SMELT steps")
    p.add_argument("--contended", action="store_true", help="beside a CPU-bound process")
    p.add_argument("--results", metavar="OUT.md", help="also write the report as a results file")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 2, 2
    torch.set_num_threads(args.threads)
    run = profile if args.profile else contended if args.contended else throughput
    title = f"train_bench {run.__name__}, preset {args.preset}"
    with recording(title, command_line("benchmarks.train_bench", argv)) as record:
        run(args)
    if args.results:
        print(f"wrote {atomic_write_text(args.results, record.text)}")


if __name__ == "__main__":
    main()
