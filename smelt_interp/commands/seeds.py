"""`python -m smelt_interp.commands.seeds --preset recall-pair --seeds 5 --out runs/recall-seeds`
(or `smelt-seeds`): train seeds 0..N-1 (TrainConfig.seed) of both models of a pair preset into
OUT/seed-{s}/{baseline,smelt}, one run at a time, reusing every run already complete there
(and resuming one that stopped); then measure each final checkpoint and write OUT/seeds.json
and OUT/seeds.md (or `--results FILE.md` and the .json beside it), headed by the command and
the commit that measured them.

What is measured follows the preset's task. Associative recall (`recall-pair`): the case_study
probe on held-out rows and on control rows (repeat_successor=False) and the head ablation
(probes.head_ablation) on the held-out rows (commands.recall_seed_tables). Dyck (`dyck-pair`):
greedy exact match on held-out words, overall and by nesting depth (commands.dyck_seed_tables),
and the case_study probe on in-context prompts made of the same words (each query after
dyck_seed_tables.CASE_DEMOS solved ones, as the paper poses it), all on the test draw (`--draw`,
data.dyck.heldout_draw: no word of it is in the validation draw the trainer and recipe sweeps
choose on). The case-study tables lead with BOS and
demonstration mass at the answer positions, head means and best heads beside uniform
attention's levels (commands.case_seed_tables). Over seeds every figure is summarized by
measure.seeds (mean, median, range, seeds above 0.3 and 0.5, a bootstrap interval over seeds
from 3 seeds on); per seed with the probe's bootstrap interval over rows. With
`--rounding-threads N` (Dyck) the first `--rounding-seeds` seeds (default 1) of both models are
trained again with N threads (the same runs but for float rounding) beside the seeds' spread.
Every checkpoint is measured on the same held-out data, so the spread over seeds is the training
seed's alone.

Single-seed figures flip between seeds; the spread over seeds is the interval that says how far
another run may land.

This module is the command: its flags, the checks made before any training, and the training.
The runs it trains are planned in commands.seed_runs; what it measures on them and the report
it writes are commands.seed_report's."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smelt_interp.cli import ArgumentParser, add_overrides, int_at_least, run_cli
from smelt_interp.commands import dyck_seed_tables
from smelt_interp.commands.seed_report import (
    DEFAULT_RECALL_LEN,
    control_spec,
    dyck_report,
    dyck_words,
    recall_report,
)
from smelt_interp.commands.seed_runs import DYCK, run_configs, run_state, task_of, train_runs
from smelt_interp.data.assoc_recall import recall_rows
from smelt_interp.data.dyck import DyckSpec
from smelt_interp.data.dyck_draws import DRAWS, TEST
from smelt_interp.errors import ConfigError
from smelt_interp.files import atomic_write_many, check_outputs, json_text
from smelt_interp.measure.case_positions import check_recall_rows
from smelt_interp.probes.inputs import probe_bytes
from smelt_interp.probes.registry import ProbeOptions
from smelt_interp.resources import require_memory
from smelt_interp.results import command_line, results_text, source_commit
from smelt_interp.train.build import build_config
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import PAIR, PRESETS
from smelt_interp.train.run_folder import check_folder_path
from smelt_interp.train.trainer import pair_configs

RESULT_JSON = "seeds.json"
RESULT_MD = "seeds.md"
DEFAULT_SEEDS = 5
DEFAULT_ROWS = 64
MAX_SEEDS = 1000  # each seed trains two models: more is a typo, not a plan
WORD_BYTES = 64  # a held-out Dyck word's memory per bracket: ids, text and its example


def parser() -> ArgumentParser:
    """The command's flags."""
    p = ArgumentParser(
        prog="python -m smelt_interp.commands.seeds",
        description="Train N seeds of a preset's Baseline/SMELT pair and report its task's "
        "figures over seeds (the case study for recall-pair, Dyck exact match for dyck-pair).",
    )
    p.add_argument("--preset", default="recall-pair", help=f"one of {', '.join(sorted(PRESETS))}")
    p.add_argument("--seeds", type=int_at_least(1), default=DEFAULT_SEEDS, help="seeds 0..N-1")
    p.add_argument(
        "--out", type=Path, default=None, help="runs folder (default runs/<preset>-seeds)"
    )
    p.add_argument(
        "--results",
        type=Path,
        default=None,
        help="the Markdown report (default OUT/seeds.md); the JSON is written beside it",
    )
    add_overrides(p, "override a training field for every run, e.g. --set steps=200")
    p.add_argument(
        "--n-rows", type=int_at_least(1), default=DEFAULT_ROWS, help="held-out recall rows"
    )
    p.add_argument("--seq-len", type=int_at_least(2), default=None, help="tokens per recall row")
    p.add_argument(
        "--n-words",
        type=int_at_least(1),
        default=dyck_seed_tables.DEFAULT_WORDS,
        help="held-out Dyck words",
    )
    p.add_argument(
        "--draw",
        choices=DRAWS,
        default=None,
        help="Dyck: the held-out words to score: test (default; for reporting) or validation "
        "(the words recipes are chosen on)",
    )
    p.add_argument(
        "--max-depth",
        type=int_at_least(1),
        default=None,
        help="Dyck: score words nesting up to this depth instead of the preset's own limit",
    )
    p.add_argument(
        "--rounding-threads",
        type=int_at_least(1),
        default=None,
        help="Dyck: train seeds again with this many threads and report them beside the spread",
    )
    p.add_argument(
        "--rounding-seeds",
        type=int_at_least(1),
        default=None,
        help="with --rounding-threads: how many seeds (from 0) to train again (default 1)",
    )
    p.add_argument(
        "--rounding-arch",
        choices=["pair", *PAIR],
        default="pair",
        help="which models the rounding rerun trains (default both)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def check_counts(args: Any, base: TrainConfig, task: str) -> DyckSpec | None:
    """Refuse, before any config is built or run trained, counts past their cap or the memory
    this machine has, and held-out data that cannot be scored; the Dyck spec words are scored
    on (None for recall)."""
    if args.seeds > MAX_SEEDS:
        raise ConfigError(f"--seeds {args.seeds} is more than {MAX_SEEDS:,}, the most trained")
    if args.rounding_threads is not None and task != DYCK:
        raise ConfigError("--rounding-threads is for Dyck presets")
    if args.draw is not None and task != DYCK:
        raise ConfigError("--draw is for Dyck presets")
    if args.rounding_seeds is not None and args.rounding_threads is None:
        raise ConfigError("--rounding-seeds needs --rounding-threads")
    if args.rounding_seeds is not None and args.rounding_seeds > args.seeds:
        raise ConfigError(
            f"--rounding-seeds must lie in 1..--seeds ({args.seeds}), got {args.rounding_seeds}"
        )
    if task == DYCK:
        spec = base.corpus.dyck.task_draw()  # scored on the words a task poses
        if args.max_depth is not None:
            spec = dataclasses.replace(spec, max_depth=args.max_depth)  # checked here
        words = args.n_words * (spec.max_len + 1) * WORD_BYTES
        require_memory(words, f"--n-words {args.n_words}")
        return spec
    models = [cfg.model_config() for cfg in pair_configs(base).values()]
    limit = min(m.max_seq_len for m in models)
    length = min(args.seq_len or min(DEFAULT_RECALL_LEN, limit), limit)
    require_memory(
        probe_bytes(models, args.n_rows, length, 0, ProbeOptions().batch_size),
        f"--n-rows {args.n_rows} x --seq-len {length}",
    )
    spec = base.corpus.assoc_recall
    rows = recall_rows(args.n_rows, length, 0, split="heldout", spec=spec)
    what = f"--n-rows {args.n_rows} x --seq-len {length}"
    check_recall_rows(rows, spec.trigger_ids, what, need_demos=True)
    control = recall_rows(args.n_rows, length, 0, split="heldout", spec=control_spec(spec))
    check_recall_rows(control, spec.trigger_ids, f"{what} (control rows)")
    return None


def check_dyck_words(base: TrainConfig, spec: DyckSpec, n_words: int, draw: str) -> None:
    """Refuse, before training, held-out words the report could not use: a draw the spec's
    input space cannot fill apart from the validation draw (a DataError from the draw), or
    words that make no case-study prompt (in_context_prompts keeps none)."""
    words = dyck_words(base, spec, n_words, draw)
    if not dyck_seed_tables.in_context_prompts(words, base.model.max_seq_len):
        per = dyck_seed_tables.CASE_DEMOS + 1
        raise ConfigError(
            f"--n-words {n_words} makes no case-study prompt: it takes {per} words in a row "
            f"that fit in {base.model.max_seq_len} tokens; give more words"
        )


def seeds_main(argv: Sequence[str] | None = None) -> int:
    """Train and measure N seeds of a pair preset; write the results as JSON and Markdown."""
    argv = list(argv) if argv is not None else sys.argv[1:]
    args = parser().parse_args(argv)
    base = build_config(args.preset, None, list(args.overrides))
    task = task_of(base)
    dyck_spec = check_counts(args, base, task)
    out = check_folder_path(args.out or Path("runs") / f"{args.preset}-seeds")
    md_path = args.results or out / RESULT_MD
    if md_path.suffix != ".md":
        raise ConfigError(f"--results must name a .md file, got {md_path}")
    json_path = md_path.with_suffix(".json")
    check_outputs({}, {"--results": md_path, "its JSON": json_path})  # not after hours of training
    archs = PAIR if args.rounding_arch == "pair" else (args.rounding_arch,)
    runs = run_configs(
        base, args.seeds, out, args.rounding_threads, archs, args.rounding_seeds or 1
    )
    states = {run.folder: run_state(run.folder, run.cfg) for run in runs}  # all checked first
    if dyck_spec is not None:
        check_dyck_words(base, dyck_spec, args.n_words, args.draw or TEST)
    train_runs(runs, states, progress=not args.quiet)
    commit = source_commit()
    command = command_line("smelt_interp.commands.seeds", argv)
    payload: dict[str, Any] = {
        "preset": args.preset,
        "command": command,
        "seeds": list(range(args.seeds)),
        "overrides": list(args.overrides),
        "models": list(PAIR),
        "commit": commit,
    }
    if dyck_spec is not None:
        payload_part, body = dyck_report(runs, dyck_spec, base, args.n_words, args.draw or TEST)
    else:
        payload_part, body = recall_report(runs, args)
    payload |= payload_part
    text = results_text(f"{args.preset}: {args.seeds} seeds", command, [body], commit)
    atomic_write_many({json_path: json_text(payload, indent=1), md_path: text})
    print(text)
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    run_cli(seeds_main)
