"""`python -m smelt_interp.commands.computed_seeds --preset computed-recall-tiny --seeds 5-9
--out runs/computed --results docs/results/computed_recall_test.md [--set k=v ...]`: the
pre-registered computed-class recall study of docs/results/computed_recall.md, end to end.

For each seed s (TrainConfig.seed = s) it trains three runs into OUT/seed-{s}/: the preset's
deep-key pair (`baseline`, `smelt`) and a shallow-key SMELT (`smelt-shallow`, the same config
with computed_recall.key=shallow), one at a time, reusing every run already complete there and
resuming one that stopped (commands.seed_runs.run_state). Then it measures each final checkpoint
on held-out rows (commands.computed_seed_tables), judges every seed on the pre-registered
criteria 1-4 and the verdict over seeds (measure.computed_criteria, whose constants are the
file's thresholds), and writes the Markdown report (`--results`, default OUT/computed_seeds.md)
and its JSON beside it, headed by the command and the commit.

Seeds 0-4 are the validation seeds the recipe is chosen on: a run that includes any of them is
refused unless `--validation` is given, and then the output says it is a validation run. Only
seeds 5-9 on the pre-registered 512 rows (`--rows`) get a verdict; any other run reports the
count of seeds meeting every criterion and what the rule would read.

This module is the command: its flags, the checks made before any training, and the training."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from smelt_interp.cli import ArgumentParser, add_overrides, int_at_least, run_cli
from smelt_interp.commands import computed_seed_tables as tables
from smelt_interp.commands.seed_runs import SeedRun, run_state, seed_dir, train_runs
from smelt_interp.config import SMELT as SMELT_ARCH
from smelt_interp.data.computed_recall import ComputedRecallSpec, computed_rows, n_demos_for
from smelt_interp.errors import ConfigError
from smelt_interp.files import atomic_write_many, check_outputs, json_text
from smelt_interp.measure import computed_criteria as cc
from smelt_interp.measure.batching import DEFAULT_BATCH
from smelt_interp.probes.inputs import probe_bytes
from smelt_interp.probes.linear_probe import FIT, class_feature
from smelt_interp.provenance import TASK_COMPUTED
from smelt_interp.resources import require_memory
from smelt_interp.results import command_line, results_text, source_commit
from smelt_interp.train.build import build_config
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.run_folder import check_folder_path
from smelt_interp.train.trainer import pair_configs

MODULE = "smelt_interp.commands.computed_seeds"
RESULT_MD = "computed_seeds.md"
MAX_SEEDS = 1000  # each seed trains three models: more is a typo, not a plan
MAX_SEED = 2**31 - 1  # TrainConfig.seed's range
REPO = Path(__file__).resolve().parents[2]


def parse_seeds(text: str) -> list[int]:
    """An argparse `type`: seeds as a list and ranges, '5-9', '5,6,7' or '5-7,9' (sorted; a
    repeated, negative or descending one is an error)."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        first, dash, last = part.partition("-")
        try:
            lo = int(first)
            hi = int(last) if dash else lo
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected seeds like 5-9 or 5,6,7, got {text!r}"
            ) from None
        if not 0 <= lo <= hi <= MAX_SEED:
            raise argparse.ArgumentTypeError(
                f"seeds lie in 0..{MAX_SEED} and a range runs low-high, got {part!r}"
            )
        if hi - lo + 1 + len(seeds) > MAX_SEEDS:
            raise argparse.ArgumentTypeError(f"more than {MAX_SEEDS:,} seeds in {text!r}")
        seeds += range(lo, hi + 1)
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"a seed is repeated in {text!r}")
    return sorted(seeds)


def parser() -> ArgumentParser:
    """The command's flags."""
    p = ArgumentParser(
        prog=f"python -m {MODULE}",
        description="Train and judge the pre-registered computed-class recall study "
        f"({cc.CRITERIA_FILE}): per seed the deep-key Baseline/SMELT pair and a shallow-key "
        "SMELT, measured on held-out rows and judged on the criteria.",
    )
    p.add_argument(
        "--preset", required=True, help="a computed-recall pair preset, e.g. computed-recall-tiny"
    )
    p.add_argument(
        "--seeds",
        type=parse_seeds,
        required=True,
        help="seeds, e.g. 5-9 (the test seeds) or 5,6,7; seeds 0-4 need --validation",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="runs folder (default runs/<preset>-computed)"
    )
    p.add_argument(
        "--results",
        type=Path,
        default=None,
        help=f"the Markdown report (default OUT/{RESULT_MD}); the JSON is written beside it",
    )
    add_overrides(p, "override a training field for every run, e.g. --set steps=200")
    p.add_argument(
        "--rows",
        type=int_at_least(1),
        default=cc.TEST_ROWS,
        help=f"held-out rows a set (default {cc.TEST_ROWS}, the pre-registered count)",
    )
    p.add_argument(
        "--validation",
        action="store_true",
        help="run validation seeds (0-4) too; the output is labelled a validation run",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def check_study(args: Any, base: TrainConfig) -> None:
    """Refuse, before any run is trained, a preset not of this task, a pair that is not the
    study's deep key on consistent labels, validation seeds without --validation, and rows the
    report could not use (too short a row, a probe without two classes to fit, memory)."""
    weight = base.corpus.weights.get(TASK_COMPUTED, 0)
    if not weight > 0:
        raise ConfigError(
            f"preset {args.preset!r} does not train {TASK_COMPUTED} (its data: "
            f"{', '.join(base.corpus.weights)}); the study needs a computed-recall pair preset"
        )
    spec = base.corpus.computed_recall
    if spec.key != "deep" or not spec.consistent_labels:
        raise ConfigError(
            "the study's pair trains the deep key on consistent labels (the command trains the "
            "shallow-key SMELT itself); drop --set computed_recall.key / consistent_labels"
        )
    early = [s for s in args.seeds if s in cc.VALIDATION_SEEDS]
    if early and not args.validation:
        raise ConfigError(
            f"seeds {cc.seed_text(early)} are validation seeds ({cc.CRITERIA_FILE}: the recipe "
            "is chosen on seeds 0-4); give --validation to run them, labelled a validation run"
        )
    models = [cfg.model_config() for cfg in pair_configs(base).values()]
    if not pair_configs(base)[SMELT_ARCH].model_config().is_looped:
        raise ConfigError(
            f"preset {args.preset!r}: its SMELT model visits each layer once; the study reads "
            "visits 0 and 1 of a looped layer"
        )
    trained = base.batch.row_len.get(TASK_COMPUTED) or base.batch.seq_len
    length = min(trained, *(m.max_seq_len for m in models))
    n_demos_for(length)  # a DataError for rows too short to hold a demonstration
    require_memory(
        probe_bytes(models, args.rows, length, 0, DEFAULT_BATCH),
        f"--rows {args.rows} x row length {length}",
    )
    for key_spec in (spec, dataclasses.replace(spec, key="shallow")):
        for seed in args.seeds:
            check_probe_rows(key_spec, args.rows, length, seed)


def check_probe_rows(spec: ComputedRecallSpec, n_rows: int, length: int, seed: int) -> None:
    """A ConfigError when the class probe's fit rows of `seed` hold fewer than two classes."""
    fit = computed_rows(n_rows, length, f"{FIT}:{seed}", split="heldout", spec=spec)
    if len(set(class_feature(fit, spec)[1].tolist())) < 2:
        raise ConfigError(
            f"--rows {n_rows}: the class probe's fit rows of seed {seed} ({spec.key} key) hold "
            "fewer than two classes; give more rows"
        )


def plan_runs(base: TrainConfig, seeds: Sequence[int], out: Path) -> list[tuple[str, SeedRun]]:
    """Every seed's (role, run) in training order: the deep-key pair, then the shallow-key
    SMELT (the same config with computed_recall.key=shallow), in OUT/seed-{s}/{role}."""
    shallow = base.with_overrides({f"{TASK_COMPUTED}.key": "shallow"})
    runs = []
    for seed in seeds:
        pair = pair_configs(dataclasses.replace(base, seed=seed))
        for role, cfg in ((tables.BASELINE, pair["baseline"]), (tables.SMELT, pair[SMELT_ARCH])):
            runs.append((role, SeedRun(seed_dir(out, seed) / role, cfg)))
        cfg = pair_configs(dataclasses.replace(shallow, seed=seed))[SMELT_ARCH]
        runs.append((tables.SHALLOW, SeedRun(seed_dir(out, seed) / tables.SHALLOW, cfg)))
    return runs


def computed_seeds_main(argv: Sequence[str] | None = None) -> int:
    """Train, measure and judge the study's seeds; write the results as Markdown and JSON."""
    argv = list(argv) if argv is not None else sys.argv[1:]
    args = parser().parse_args(argv)
    base = build_config(args.preset, None, list(args.overrides))
    check_study(args, base)
    out = check_folder_path(args.out or Path("runs") / f"{args.preset}-computed")
    md_path = args.results or out / RESULT_MD
    if md_path.suffix != ".md":
        raise ConfigError(f"--results must name a .md file, got {md_path}")
    criteria = REPO / cc.CRITERIA_FILE
    if md_path.resolve() == criteria.resolve():
        raise ConfigError(f"--results {md_path} is the pre-registered criteria file; name another")
    json_path = md_path.with_suffix(".json")
    check_outputs({}, {"--results": md_path, "its JSON": json_path})  # not after the training
    runs = plan_runs(base, args.seeds, out)
    states = {run.folder: run_state(run.folder, run.cfg) for _, run in runs}  # all checked first
    train_runs([run for _, run in runs], states, progress=not args.quiet)
    records, layers = [], []
    for role, run in runs:
        record, frame = tables.measure_run(run, role, args.rows)
        records.append(record)
        layers.append(frame)
    payload_part, body, outcome = tables.report(
        args.seeds,
        pd.DataFrame(records),
        pd.concat(layers, ignore_index=True),
        n_rows=args.rows,
        validation=args.validation,
    )
    commit = source_commit()
    command = command_line(MODULE, argv)
    payload: dict[str, Any] = {
        "preset": args.preset,
        "command": command,
        "commit": commit,
        "seeds": list(args.seeds),
        "overrides": list(args.overrides),
        "runs": list(tables.RUNS),
    }
    payload |= payload_part
    label = " (validation run)" if args.validation else ""
    title = f"Computed-class recall, {args.preset}: seeds {cc.seed_text(args.seeds)}{label}"
    text = results_text(title, command, [body], commit)
    atomic_write_many({json_path: json_text(payload, indent=1), md_path: text})
    print(f"{title}\n{outcome.text}")
    for row in payload["per_seed"]:
        met = ", ".join(f"{c[-1]} {tables.met(row[c])}" for c in cc.CRITERION_COLUMNS)
        print(f"seed {row['seed']}: criteria {met}; all four {tables.met(row[cc.ALL_MET])}")
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    run_cli(computed_seeds_main)
