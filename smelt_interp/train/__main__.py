"""`python -m smelt_interp.train`: train one model or a Baseline/SMELT pair from a preset,
a JSON config file and `--set key=value` overrides. Subcommands: `ladder ...` trains a scaling
ladder (smelt_interp.train.ladder); `eval CKPT ...` reports held-out losses and Dyck exact match
of trained checkpoints (smelt_interp.train.assess)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from smelt_interp.cli import ArgumentParser, run_cli
from smelt_interp.train.config import TrainConfig, load_config_file, parse_override
from smelt_interp.train.presets import PAIR, PRESETS, get_preset
from smelt_interp.train.trainer import train_pair


def build_config(
    preset: str | None, config_file: str | None, overrides: Sequence[str]
) -> TrainConfig:
    """Preset, then config file, then `--set` overrides. A learning rate given in the file or
    on the command line applies to both architectures: it replaces the preset's `arch_lr`
    unless `arch_lr` is given alongside it."""
    data = get_preset(preset) if preset else {}
    user = load_config_file(config_file) if config_file else {}
    user.update(dict(parse_override(o) for o in overrides))
    if "lr" in user and not any(key.partition(".")[0] == "arch_lr" for key in user):
        user = {"arch_lr": {}, **user}
    cfg = TrainConfig.from_dict(data)
    return cfg.with_overrides(user) if user else cfg


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "ladder":
        from smelt_interp.train.ladder import main as ladder_main

        return ladder_main(argv[1:])
    if argv and argv[0] == "eval":
        from smelt_interp.train.assess import main as assess_main

        return assess_main(argv[1:])
    p = ArgumentParser(
        prog="python -m smelt_interp.train",
        description="Train a Baseline, a SMELT model, or a budget-matched pair.",
    )
    p.add_argument("--preset", default="dyck-pair", help=f"one of {', '.join(sorted(PRESETS))}")
    p.add_argument("--config", help="JSON file of TrainConfig fields (applied after the preset)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field, e.g. --set steps=200 --set model.d_model=64",
    )
    p.add_argument("--arch", choices=["pair", *PAIR], default="pair")
    p.add_argument("--out", help="output folder (default runs/<preset>)")
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="PATH",
        help="add user text (file, folder or JSONL) as a training domain",
    )
    p.add_argument("--resume", action="store_true", help="continue from <out>/<arch>/state.pt")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    overrides = list(args.overrides)
    cfg = build_config(args.preset, args.config, overrides)
    if args.data:
        from smelt_interp.data.sources import load_source

        for path in args.data:
            load_source(path)  # fail now, with the file named, not mid-run
        cfg = cfg.with_overrides(
            {
                "data_paths": cfg.data_paths + args.data,
                "data": {**cfg.data, "text": cfg.data.get("text", 0.25)},
            }
        )
    out = Path(args.out or Path("runs") / args.preset)
    archs = PAIR if args.arch == "pair" else (args.arch,)
    results = train_pair(cfg, out, archs=archs, resume=args.resume, progress=not args.quiet)
    for arch, res in results.items():
        shown = ", ".join(f"{k} {v:.4f}" for k, v in res.final_eval.items())
        print(f"{arch}: {res.checkpoint} ({res.tokens:,} tokens, {res.seconds:.0f} s) {shown}")
        for horizon, path in sorted(res.branches.items()):
            print(f"  branch at step {horizon}: {path}")
    if any("dyck_exact_match" in res.final_eval for res in results.values()):
        ckpts = " ".join(str(res.checkpoint) for res in results.values())
        print(
            f"(exact match on {cfg.dyck_eval_n} held-out Dyck examples; for 1,000 with a "
            f"confidence interval: python -m smelt_interp.train eval {ckpts})"
        )
    return 0


if __name__ == "__main__":
    run_cli(main)
