"""`python -m smelt_interp.train`: the training commands.

    python -m smelt_interp.train [--preset P] [--config F] [--set KEY=VALUE ...]   a pair, or one
    python -m smelt_interp.train ladder [--sizes N] [--set KEY=VALUE ...]          a scaling ladder
    python -m smelt_interp.train eval CKPT [CKPT ...] [--shards DIR]               a final report

A configuration is a preset, then a JSON config file, then `--set key=value` overrides (values
are JSON when they parse, else strings). The work itself lives in `trainer` (train_pair),
`ladder` (run_ladder) and `assess` (assess)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from smelt_interp.checkpoint import read_info
from smelt_interp.cli import ArgumentParser, add_overrides, run_cli
from smelt_interp.data.dyck import DEPTH_BUCKETS
from smelt_interp.errors import ConfigError
from smelt_interp.files import (
    atomic_write_many,
    atomic_write_text,
    check_outputs,
)
from smelt_interp.resources import require_memory
from smelt_interp.results import command_line, results_text, table_block
from smelt_interp.train.assess import assess, format_report
from smelt_interp.train.build import config_from, config_layers, parse_override
from smelt_interp.train.config import TrainConfig, apply_overrides
from smelt_interp.train.distributed import is_launch_main
from smelt_interp.train.ladder import CPU_LADDER, CPU_SIZES, RUNS_FILE, loss_table, run_ladder
from smelt_interp.train.presets import PAIR, PRESETS
from smelt_interp.train.trainer import train_pair

# What one held-out example or row costs while `train eval` holds it, per position of its
# context: its tokens as Python ints and tensors, and the prompt and answer kept beside them.
EVAL_BYTES_PER_POSITION = 64


def archs_to_train(cli_arch: str | None, named_arch: str | None) -> tuple[str, ...]:
    """What trains: `--arch` when given, else the config's own `arch` (preset, file or `--set`,
    the last that names one), else the pair. A config that names an architecture and an
    `--arch` that differs from it are refused, not silently resolved."""
    if named_arch is None:
        return PAIR if cli_arch in (None, "pair") else (cli_arch,)
    if cli_arch not in (None, named_arch):
        raise ConfigError(
            f"--arch {cli_arch} conflicts with the config's arch {named_arch!r}; "
            "drop one of them (or set arch to match)"
        )
    return (named_arch,)


def parser(command: str, description: str) -> ArgumentParser:
    """The parser of `python -m smelt_interp.train [command]`."""
    prog = f"python -m smelt_interp.train {command}".rstrip()
    return ArgumentParser(prog=prog, description=description)


# ----- python -m smelt_interp.train ------------------------------------------------------------
def train_main(argv: Sequence[str] | None = None) -> int:
    p = parser("", "Train a Baseline, a SMELT model, or a budget-matched pair.")
    p.add_argument("--preset", default="dyck-pair", help=f"one of {', '.join(sorted(PRESETS))}")
    p.add_argument("--config", help="JSON file of TrainConfig fields (applied after the preset)")
    add_overrides(
        p, "override a field by path or flat key, e.g. --set optim.lr=1e-3 --set steps=200"
    )
    p.add_argument(
        "--arch",
        choices=["pair", *PAIR],
        help="what to train (default: the config's own arch if it names one, else the pair)",
    )
    p.add_argument("--out", help="output folder (default runs/<preset>)")
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="PATH",
        help="add user text (file, folder or JSONL) as a training domain",
    )
    p.add_argument(
        "--shards",
        metavar="DIR",
        help="train on prepared token shards (python -m smelt_interp.data prepare); weigh their "
        "domains with --set data.DOMAIN=WEIGHT",
    )
    p.add_argument("--resume", action="store_true", help="continue from <out>/<arch>/state.pt")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    data, user = config_layers(args.preset, args.config, list(args.overrides))
    cfg = config_from(data, user)  # built once; the flags below make typed copies of it
    archs = archs_to_train(args.arch, user.get("arch", data.get("arch")))
    if args.shards:
        cfg = cfg.with_overrides(shard_overrides(cfg, args.shards, args.overrides))
    if args.data:
        from smelt_interp.data.sources import load_source

        for path in args.data:
            load_source(path)  # fail now, with the file named, not mid-run
        cfg = cfg.with_overrides(
            {
                "corpus.paths": cfg.corpus.paths + args.data,
                "corpus.weights": {
                    **cfg.corpus.weights,
                    "text": cfg.corpus.weights.get("text", 0.25),
                },
            }
        )
    out = Path(args.out or Path("runs") / args.preset)
    results = train_pair(cfg, out, archs=archs, resume=args.resume, progress=not args.quiet)
    if not is_launch_main():
        return 0  # under torchrun, rank 0 reports for every rank
    for arch, res in results.items():
        # per-head figures ("case/.../layer.visit.head") stay in metrics.jsonl, off this line
        per_run = {k: v for k, v in res.final_eval.items() if k.count(".") < 2}
        shown = ", ".join(f"{k} {v:.4f}" for k, v in per_run.items())
        print(f"{arch}: {res.checkpoint} ({res.tokens:,} tokens, {res.seconds:.0f} s) {shown}")
        for horizon, path in sorted(res.branches.items()):
            print(f"  branch at step {horizon}: {path}")
    if any("dyck_exact_match" in res.final_eval for res in results.values()):
        ckpts = " ".join(str(res.checkpoint) for res in results.values())
        print(
            f"(exact match on {cfg.eval.dyck_n} held-out Dyck examples; for 1,000 with a "
            f"confidence interval: python -m smelt_interp.train eval {ckpts})"
        )
    return 0


def shard_overrides(cfg: TrainConfig, folder: str, overrides: Sequence[str]) -> dict[str, Any]:
    """What `--shards DIR` sets: the folder, the model's vocabulary and BOS from its tokenizer,
    and the data weights: each shard domain 1.0 unless `--set data.DOMAIN=W` gave one; the
    preset's generated domains only where a `--set data.X` names them."""
    from smelt_interp.data.shards import ShardSet

    shards = ShardSet(folder)
    named = {key.partition("=")[0].strip() for key in overrides}
    data = {d: cfg.corpus.weights.get(d, 1.0) for d in shards.domains("train")}
    data |= {d: w for d, w in cfg.corpus.weights.items() if f"data.{d}" in named}
    return {
        "corpus.shards": folder,
        "corpus.weights": data,
        "model.vocab_size": shards.tokenizer.vocab_size,
        "model.bos_token_id": shards.tokenizer.bos_id,
    }


# ----- python -m smelt_interp.train ladder -----------------------------------------------------
def ladder_main(argv: Sequence[str] | None = None) -> int:
    p = parser("ladder", "Train a budget-matched Baseline/SMELT scaling ladder.")
    p.add_argument("--sizes", type=int, default=3, help=f"how many sizes (1..{len(CPU_SIZES)})")
    p.add_argument("--out", default="runs/ladder")
    add_overrides(p, "override a training field for every run, e.g. --set steps=960")
    p.add_argument("--resume", action="store_true", help="skip finished runs, resume the others")
    p.add_argument("--quiet", action="store_true")
    p.add_argument(
        "--results",
        metavar="OUT.md",
        help="also write the losses as a results file, with the runs table as OUT.csv beside it",
    )
    args = p.parse_args(argv)
    if not 1 <= args.sizes <= len(CPU_SIZES):
        raise ConfigError(f"--sizes must be 1..{len(CPU_SIZES)}, got {args.sizes}")
    raw = Path(args.results).with_suffix(".csv") if args.results else None
    check_outputs({}, {"--results": args.results, "--results (its .csv)": raw})
    base = apply_overrides(CPU_LADDER, dict(parse_override(t) for t in args.overrides))
    table = run_ladder(
        base, CPU_SIZES[: args.sizes], args.out, resume=args.resume, progress=not args.quiet
    )
    print(table.to_string(index=False))
    print(f"wrote {Path(args.out) / RUNS_FILE}")
    if args.results:
        command = command_line("smelt_interp.train ladder", sys.argv[2:] if argv is None else argv)
        title = f"Scaling ladder: {args.sizes} sizes, Baseline and matched SMELT"
        note = f"Held-out loss (mean of the domains' losses); every run is in {raw.name}."
        text = results_text(title, command, [note, table_block("losses", loss_table(table))])
        for path in atomic_write_many({args.results: text, raw: table.to_csv(index=False)}):
            print(f"wrote {path}")
    return 0


# ----- python -m smelt_interp.train eval -------------------------------------------------------
def eval_main(argv: Sequence[str] | None = None) -> int:
    p = parser("eval", "Held-out losses and greedy Dyck exact match of trained checkpoints.")
    p.add_argument("checkpoints", nargs="+", metavar="CKPT")
    p.add_argument("--n", type=int, default=1000, help="held-out Dyck examples (default 1000)")
    p.add_argument(
        "--per-depth",
        type=int,
        metavar="K",
        help="instead of --n random examples, K in each nesting-depth range the run reaches",
    )
    p.add_argument(
        "--max-depth",
        type=int,
        metavar="D",
        help="held-out words nest up to D deep (default: the run's own Dyck limit)",
    )
    p.add_argument("--seed", type=int, help="seed of the examples (default: the run's seed + 1000)")
    p.add_argument(
        "--loss-rows", type=int, default=64, help="held-out rows per domain for the losses"
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="PATH",
        help="the run's user text (a checkpoint's own data_paths are never read)",
    )
    p.add_argument(
        "--shards",
        metavar="DIR",
        help="also the held-out loss of each domain of this prepared folder (of the "
        "checkpoint's tokenizer; a checkpoint's own shard folder is never read)",
    )
    p.add_argument("--json", metavar="OUT", help="also write the reports as JSON")
    args = p.parse_args(argv)
    if args.n < 0 or args.loss_rows < 1 or args.threads < 0:
        p.error("--n and --threads must be >= 0 and --loss-rows >= 1")
    for flag, value in (("--per-depth", args.per_depth), ("--max-depth", args.max_depth)):
        if value is not None and value < 1:
            p.error(f"{flag} must be >= 1")
    inputs = {f"CKPT {c}": c for c in args.checkpoints} | {f"--data {d}": d for d in args.data}
    inputs |= {"--shards": args.shards} if args.shards else {}
    check_outputs(inputs, {"--json": args.json})
    for ckpt in args.checkpoints:
        require_memory(eval_bytes(ckpt, args), eval_flags(args))
    if args.threads:
        torch.set_num_threads(args.threads)
    reports = []
    for ckpt in args.checkpoints:
        reports.append(
            assess(
                ckpt,
                args.n,
                args.seed,
                args.loss_rows,
                args.per_depth,
                args.max_depth,
                data_paths=args.data,
                shards=args.shards,
            )
        )
        print(format_report(reports[-1]), flush=True)
        if reports[-1].get("user_data_not_read"):
            paths = " ".join(reports[-1]["user_data_not_read"])
            print(f"  (user text not read; to measure it pass --data: {paths})", flush=True)
    if args.json:
        atomic_write_text(args.json, json.dumps(reports, indent=2) + "\n")
    return 0


def eval_flags(args: Any) -> str:
    """The flags that size `train eval`'s work, as the user typed them."""
    sample = f"--per-depth {args.per_depth}" if args.per_depth else f"--n {args.n}"
    return f"{sample} and --loss-rows {args.loss_rows}"


def eval_bytes(ckpt: str, args: Any) -> int:
    """An estimate of the memory `train eval` holds for one checkpoint: its held-out Dyck
    examples (--n, or --per-depth in each depth range) and its loss rows per domain, each a
    row of the run's context; known from the checkpoint's metadata before any work."""
    train_config = read_info(ckpt).train_config or {}
    seq_len = train_config.get("seq_len", 1)
    domains = train_config.get("data", {})
    seq_len = seq_len if isinstance(seq_len, int) and seq_len > 0 else 1
    n_domains = max(len(domains), 1) if isinstance(domains, dict) else 1
    examples = args.per_depth * len(DEPTH_BUCKETS) if args.per_depth else args.n
    rows = args.loss_rows * n_domains
    return (examples + rows) * seq_len * EVAL_BYTES_PER_POSITION


COMMANDS = {"ladder": ladder_main, "eval": eval_main}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    return train_main(argv)


if __name__ == "__main__":
    run_cli(main)
