"""Training throughput of the sink pair (`sink-pair`: Dyck, trigger and code rows blended at
their own row lengths, one forward pass per length) against the default pair (`dyck-pair`: one
packed batch), both architectures, eager, in interleaved rounds of one process (median). Tokens
are the rows' real tokens (PAD excluded); the data pipeline's own time per step is shown beside,
so a slower pair can be told apart from a slower data pipeline.

python -m benchmarks.pair_bench [--steps N] [--rounds R] [--threads 2] [--quick] [--results OUT.md]

`--results` also writes the report as a results file (smelt_interp.results: the command and the
commit that measured it), for the README to cite."""

from __future__ import annotations

import argparse
import sys
import time

import torch

from benchmarks.train_bench import ARCHS, build, interleaved_seconds
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.files import atomic_write_text
from smelt_interp.results import command_line, recording
from smelt_interp.train.trainer import Trainer

PAIRS = ("dyck-pair", "sink-pair")


def real_tokens_per_step(trainer: Trainer, steps: int) -> float:
    """Mean non-PAD tokens a step over the first `steps` steps (all micro-batches)."""
    data, accum = trainer.data, trainer.cfg.batch.grad_accum
    total = sum(
        int((part != PAD_ID).sum())
        for step in range(steps)
        for micro in range(accum)
        for part in data.batch_parts(step, micro)
    )
    return total / steps


def data_seconds_per_step(trainer: Trainer, steps: int) -> float:
    """Seconds the data pipeline takes to build one step's rows."""
    start = time.perf_counter()
    for step in range(steps):
        for micro in range(trainer.cfg.batch.grad_accum):
            trainer.data.batch_parts(step, micro)
    return (time.perf_counter() - start) / steps


def main(
    argv: list[str] | None = None,
    pairs: tuple[str, str] = PAIRS,
    steps: int = 5,
    rounds: int = 3,
    module: str = "benchmarks.pair_bench",
) -> None:
    """Measure `pairs` (the reference pair, then the one compared with it) side by side."""
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="2 rounds x 2 steps")
    p.add_argument("--results", metavar="OUT.md", help="also write the report as a results file")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 2, 2
    torch.set_num_threads(args.threads)
    title = f"Training throughput of {pairs[1]} against {pairs[0]}"
    with recording(title, command_line(module, argv)) as record:
        measure(pairs, args)
    if args.results:
        print(f"wrote {atomic_write_text(args.results, record.text)}")


def measure(pairs: tuple[str, str], args: argparse.Namespace) -> None:
    """Time both architectures of both pairs in interleaved rounds and print tokens/s."""
    trainers = {
        (pair, arch): build(pair, arch, args.threads, False) for pair in pairs for arch in ARCHS
    }
    _, seconds = interleaved_seconds(trainers, args.steps, args.rounds)
    print(
        f"training throughput of {pairs[1]} against {pairs[0]}, eager, "
        f"{args.threads} threads, {args.rounds} rounds x {args.steps} steps (median)"
    )
    print(f"  {'':22s} {'tokens/step':>12s} {'tok/s':>10s} {'data ms/step':>13s}")
    rates = {}
    for (pair, arch), trainer in trainers.items():
        tokens = real_tokens_per_step(trainer, args.steps)
        rates[pair, arch] = tokens * args.steps / seconds[pair, arch]
        data_ms = 1e3 * data_seconds_per_step(trainer, args.steps)
        print(
            f"  {pair + ' ' + arch:22s} {tokens:12,.0f} {rates[pair, arch]:10,.0f} {data_ms:13.1f}"
        )
    for arch in ARCHS:
        ratio = rates[pairs[1], arch] / rates[pairs[0], arch]
        print(f"  {arch}: {pairs[1]} / {pairs[0]} tokens/s {ratio:.3f}")


if __name__ == "__main__":
    main()
