"""Patching over every (layer, visit, head) of the default pair's SMELT shape on the default
prompt pair (8 held-out Dyck prompts with a changed bracket): attribution patching (one clean
forward, one corrupted forward, one backward) and activation patching batched over nodes
(`--copies` patched copies per forward pass), each against activation patching node by node
(one forward per node, the same edit), as ratios of medians over interleaved rounds. A second
comparison patches the residual stream per (layer, visit, position): hundreds of nodes.

python -m benchmarks.patching_bench [--ckpt CKPT] [--threads 2] [--rounds 3] [--quick]"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from smelt_interp.config import ModelConfig
from smelt_interp.data.patch_pairs import dyck_pair
from smelt_interp.loading import load_model
from smelt_interp.measure.patching import (
    DEFAULT_COPIES,
    activation_patching,
    attribution_patching,
    nodes_of,
)
from smelt_interp.model.transformer import SmeltModel

# The default pair's SMELT shape (train.presets dyck-pair: 4 layers, layers 1-2 twice).
SHAPE = dict(
    d_model=96, n_layers=4, n_heads=4, n_kv_heads=2, d_head=22, n_experts=12, top_k=2, d_expert=120
)


def median_seconds(contenders: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Each contender once to warm up, then `rounds` interleaved rounds; the median of each."""
    for fn in contenders.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def compare(model, pair, nodes, copies: int, rounds: int, label: str) -> None:
    """Print attribution, batched activation and node-by-node activation patching of `nodes`."""
    seconds = median_seconds(
        {
            "attribution": lambda: attribution_patching(model, pair, nodes),
            "batched": lambda: activation_patching(model, pair, nodes, batch=copies),
            "one by one": lambda: activation_patching(model, pair, nodes, batch=1),
        },
        rounds,
    )
    loop = seconds["one by one"]
    print(f"{label}: {len(nodes)} nodes, {pair.n_rows} rows x {pair.length} tokens")
    print(f"  attribution patching    {seconds['attribution']:8.3f} s   loop/attribution "
          f"{loop / seconds['attribution']:6.1f}x")  # fmt: skip
    print(f"  activation, batched {copies:>3} {seconds['batched']:8.3f} s   loop/batched     "
          f"{loop / seconds['batched']:6.1f}x")  # fmt: skip
    print(f"  activation, node by node {loop:7.3f} s")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", default=None, help="a checkpoint instead of the random model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--copies", type=int, default=DEFAULT_COPIES)
    p.add_argument("--quick", action="store_true", help="heads only, one round")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.ckpt:
        model, _ = load_model(args.ckpt)
    else:
        torch.manual_seed(0)
        model = SmeltModel(ModelConfig.smelt(max_seq_len=512, **SHAPE)).eval()
    model.eval()
    pair = dyck_pair(8, max_len=model.cfg.max_seq_len)
    rounds = 1 if args.quick else args.rounds
    print(f"{args.threads} threads, {len(model.schedule)} visits x {model.cfg.n_heads} heads")
    compare(model, pair, nodes_of(model, "z", per_head=True), args.copies, rounds, "heads' z")
    if not args.quick:
        nodes = nodes_of(model, "resid_pre", per_position=True, length=pair.length)
        compare(model, pair, nodes, args.copies, 1, "residual stream per position")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
