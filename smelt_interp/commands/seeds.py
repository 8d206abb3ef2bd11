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
another run may land."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from smelt_interp.checkpoint import load_checkpoint, read_info
from smelt_interp.cli import ArgumentParser, int_at_least, require_memory, run_cli
from smelt_interp.commands import case_seed_tables, dyck_seed_tables, recall_seed_tables
from smelt_interp.commands.run_log import held_sink, train_seconds
from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_rows
from smelt_interp.data.dyck import DRAWS, TEST, DyckExample, DyckSpec
from smelt_interp.errors import CheckpointError, ConfigError, RunFolderError
from smelt_interp.files import atomic_write_many, check_outputs, json_text
from smelt_interp.measure.case_positions import check_recall_rows
from smelt_interp.measure.provenance import CKPT_FILE, METRICS_FILE, Provenance, task_of_mix
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes import case_masses, case_study
from smelt_interp.probes.head_ablation import ablate_heads
from smelt_interp.probes.inputs import ProbeInputs, probe_bytes
from smelt_interp.probes.registry import ProbeOptions
from smelt_interp.results import command_line, results_text, source_commit
from smelt_interp.train.build import build_config
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import PAIR, PRESETS
from smelt_interp.train.run_folder import STATE_FILE, check_folder_path
from smelt_interp.train.state import read_state
from smelt_interp.train.trainer import Trainer, pair_configs

RESULT_JSON = "seeds.json"
RESULT_MD = "seeds.md"
DEFAULT_SEEDS = 5
DEFAULT_ROWS = 64
MAX_SEEDS = 1000  # each seed trains two models: more is a typo, not a plan
DEFAULT_RECALL_LEN = 256
WORD_BYTES = 64  # a held-out Dyck word's memory per bracket: ids, text and its example


RECALL, DYCK = "assoc_recall", "dyck"
# the JSON's names for the case-study frames (commands.case_seed_tables.KEYS), per seed and over
# seeds alike
JSON_NAMES = {"visits": "by_visit", "pairs": "visit_pairs", "split": "non_answer"}
JSON_NAMES["control"] = "control"


@dataclass(frozen=True)
class SeedRun:
    """One training run of the command: its folder, its config, and whether it is one of the
    seeds ("seed") or the rounding check's rerun of a seed with another thread count."""

    folder: Path
    cfg: TrainConfig
    role: str = "seed"


def seed_dir(out: Path, seed: int) -> Path:
    return out / f"seed-{seed}"


def task_of(cfg: TrainConfig) -> str:
    """The task a preset's runs are measured on: associative recall when it trains on it, else
    Dyck; a ConfigError for a preset with neither."""
    task = task_of_mix(cfg.corpus.weights)
    if task == RECALL or cfg.corpus.weights.get(DYCK, 0) > 0:
        return task
    raise ConfigError(
        "the seeds command measures associative recall or Dyck; the preset has neither"
    )


def run_configs(
    base: TrainConfig,
    n_seeds: int,
    out: Path,
    rounding_threads: int | None = None,
    rounding_archs: Sequence[str] = PAIR,
    rounding_seeds: int = 1,
) -> list[SeedRun]:
    """Every seed and model, in training order, then the rounding runs: seeds 0 to
    `rounding_seeds` - 1 of each of `rounding_archs` with `rounding_threads` threads, in
    OUT/seed-S-threads-N."""
    runs = []
    for seed in range(n_seeds):
        for arch, cfg in pair_configs(base.with_overrides({"seed": seed})).items():
            runs.append(SeedRun(seed_dir(out, seed) / arch, cfg))
    if rounding_threads is not None:
        if rounding_threads == base.runtime.threads:
            raise ConfigError(
                f"--rounding-threads {rounding_threads} is the preset's own thread count; "
                "give another so the rerun differs in rounding"
            )
        if not 1 <= rounding_seeds <= n_seeds:
            raise ConfigError(
                f"--rounding-seeds must lie in 1..--seeds ({n_seeds}), got {rounding_seeds}"
            )
        for seed in range(rounding_seeds):
            rerun = base.with_overrides({"seed": seed, "threads": rounding_threads})
            for arch, cfg in pair_configs(rerun).items():
                if arch in rounding_archs:
                    folder = out / f"seed-{seed}-threads-{rounding_threads}" / arch
                    runs.append(SeedRun(folder, cfg, "rounding"))
    return runs


def run_state(run_dir: Path, cfg: TrainConfig) -> str:
    """ "complete" (a final checkpoint of this config at its last step), "resumable" (a
    training state of this config) or "new" (nothing there); a RunFolderError for a folder
    holding a run of another config, which training would replace."""
    ckpt, state = run_dir / CKPT_FILE, run_dir / STATE_FILE
    if ckpt.exists():
        info = read_info(ckpt)
        same = info.train_config is not None and _same_config(info.train_config, cfg)
        if not same:
            raise RunFolderError(
                f"{run_dir} holds a run of another training config; choose another --out"
            )
        if info.final and info.step == cfg.schedule.steps:
            return "complete"
    if state.exists():
        try:
            read_state(state, cfg)
        except CheckpointError as exc:
            raise RunFolderError(f"{exc}; choose another --out") from None
        return "resumable"
    if ckpt.exists() or (run_dir / METRICS_FILE).exists():
        raise RunFolderError(f"{run_dir} holds a run that cannot be resumed; choose another --out")
    return "new"


def _same_config(saved: dict[str, Any], cfg: TrainConfig) -> bool:
    try:
        return TrainConfig.from_dict(saved).same_run(cfg)
    except Exception:  # a config this version cannot read is not this run's
        return False


def recall_inputs(
    model: SmeltModel, spec: AssocRecallSpec, n_rows: int, seq_len: int
) -> ProbeInputs:
    """The probe inputs of the case study on `n_rows` held-out associative-recall rows of
    `spec` (the held-out stream of seed 0: every checkpoint is measured on the same rows)."""
    return ProbeInputs(
        n_seqs=n_rows,
        seq_len=seq_len,
        seed=0,
        max_seq_len=model.cfg.max_seq_len,
        assoc_recall=spec,
        task="assoc_recall",
    )


def control_spec(spec: AssocRecallSpec) -> AssocRecallSpec:
    """The control of `spec`: every occurrence of a trigger draws a fresh successor, so an
    answer cannot be read off the demonstrations."""
    return dataclasses.replace(spec, repeat_successor=False)


def probe_run(
    run_dir: Path, cfg: TrainConfig, n_rows: int, seq_len: int | None
) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """(case-study frames (commands.case_seed_tables.checkpoint_figures, the control rows'
    included), model figures) of a run's final checkpoint."""
    ckpt = run_dir / CKPT_FILE
    model, info = load_checkpoint(ckpt)
    spec = Provenance.of(info).recall_spec
    length = min(seq_len or default_length(model), model.cfg.max_seq_len)
    inputs = recall_inputs(model, spec, n_rows, length)
    tables = case_study.run(model, inputs, ProbeOptions())
    control_inputs = recall_inputs(model, control_spec(spec), n_rows, length)
    control = case_study.run(model, control_inputs, ProbeOptions())
    rows = inputs.recall_rows()
    heads = recall_seed_tables.answer_heads(tables)  # the ablated heads are chosen from the probe's
    ablation = ablate_heads(model, rows, spec, masses=heads)
    figures = recall_seed_tables.model_figures(tables, heads, ablation.table, held_sink(run_dir))
    figures |= {
        "tokens": int(info.meta.get("tokens", 0)),
        "train_seconds": train_seconds(run_dir, cfg),
    }
    return case_seed_tables.checkpoint_figures(tables, control), figures


def default_length(model: SmeltModel) -> int:
    """The rows' default length: the model's context, at most DEFAULT_RECALL_LEN tokens."""
    return min(DEFAULT_RECALL_LEN, model.cfg.max_seq_len)


def dyck_run(
    run: SeedRun, words: Sequence[Any]
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, pd.DataFrame] | None]:
    """(exact-match rows by depth, run figures, case-study frames) of a run's final checkpoint
    on `words`; the case study (the case_study probe's mass tables on in-context prompts made
    of the same words, dyck_seed_tables.in_context_prompts, reduced by
    commands.case_seed_tables) for the seed runs only (None for the rounding reruns)."""
    model, info = load_checkpoint(run.folder / CKPT_FILE)
    who = {"seed": run.cfg.seed, "model": run.cfg.arch, "threads": run.cfg.runtime.threads}
    rows = [who | row for row in dyck_seed_tables.exact_match_rows(model, words)]
    figures = who | {
        "role": run.role,
        "tokens": int(info.meta.get("tokens", 0)),
        "train_seconds": train_seconds(run.folder, run.cfg),
    }
    frames = None
    if run.role == "seed":
        prompts = dyck_seed_tables.in_context_prompts(words, model.cfg.max_seq_len)
        frames = dyck_case_frames(model, prompts)
    return rows, figures, frames


def dyck_case_frames(model: SmeltModel, prompts: Sequence[Any]) -> dict[str, pd.DataFrame]:
    """The case study's figures of `model` on in-context Dyck prompts: the case_study probe's
    mass tables, reduced per checkpoint by commands.case_seed_tables."""
    masses = case_masses.dyck_masses(model, prompts)
    return case_seed_tables.checkpoint_figures(case_study.mass_tables(masses, model.schedule))


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
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a training field for every run, e.g. --set steps=200",
    )
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
    for run in runs:
        if states[run.folder] == "complete":
            train_seconds(run.folder, run.cfg)  # its log is read now, not after the training
            print(f"{run.folder}: complete, reused", flush=True)
            continue
        resume = states[run.folder] == "resumable"
        Trainer(run.cfg, run.folder, resume=resume, progress=not args.quiet).run()
        print(f"{run.folder}: trained", flush=True)
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
        payload_part, body = _dyck_report(runs, dyck_spec, base, args.n_words, args.draw or TEST)
    else:
        payload_part, body = _recall_report(runs, args)
    payload |= payload_part
    text = results_text(f"{args.preset}: {args.seeds} seeds", command, [body], commit)
    atomic_write_many({json_path: json_text(payload, indent=1), md_path: text})
    print(text)
    print(f"wrote {json_path} and {md_path}")
    return 0


def validation_words(base: TrainConfig, n_words: int) -> int:
    """How many validation words the test draw is kept apart from: the seeds command's own
    validation draw of `n_words`, and the words the trainer's periodic evaluation scores (its
    examples with their demonstrations), whichever is more."""
    return max(n_words, base.eval.dyck_n * (base.eval.dyck_demos + 1))


def dyck_words(base: TrainConfig, spec: DyckSpec, n_words: int, draw: str) -> list[DyckExample]:
    """The held-out words the Dyck report scores: `n_words` of the named draw of `spec`."""
    apart = validation_words(base, n_words)
    return dyck_seed_tables.heldout_words(n_words, spec, draw, apart_from=apart)


def _dyck_report(
    runs: Sequence[SeedRun], spec: DyckSpec, base: TrainConfig, n_words: int, draw: str
) -> tuple[dict[str, Any], str]:
    training = base.corpus.dyck
    words = dyck_words(base, spec, n_words, draw)
    rows, figures, parts = [], [], []
    for run in runs:
        by_depth, run_figures, frames = dyck_run(run, words)
        rows += [row | {"role": run.role} for row in by_depth]
        figures.append(run_figures)
        if frames is not None:
            parts.append(({"seed": run.cfg.seed, "model": run.cfg.arch}, frames))
    table = pd.DataFrame(rows)
    per_seed = table[table["role"] == "seed"].drop(columns="role")
    rounding = table[table["role"] == "rounding"].drop(columns="role")
    run_table = pd.DataFrame(figures)
    summary = dyck_seed_tables.summarize(per_seed)
    payload = {
        "task": DYCK,
        "n_words": n_words,
        "draw": draw,
        "draw_apart_from": validation_words(base, n_words) if draw == TEST else None,
        "dyck": dataclasses.asdict(spec),
        "training_dyck": dataclasses.asdict(training),
        "words_seed": dyck_seed_tables.WORDS_SEED,
        "over_seeds": summary.to_dict("records"),
        "targets": dyck_seed_tables.targets(per_seed).to_dict("records"),
        "per_seed": per_seed.to_dict("records"),
        "runs": figures,
    }
    if len(rounding):
        check = dyck_seed_tables.rounding_check(per_seed, rounding)
        payload["rounding"] = check.to_dict("records")
        spread = dyck_seed_tables.rounding_spread(per_seed, rounding)
        payload["rounding_spread"] = spread.to_dict("records")
    case_frames = stack_frames(parts)
    case_summary = case_seed_tables.summarize(case_frames)
    payload["case_study"] = {
        "probe": case_study.PROBE.name,
        "over_seeds": {
            JSON_NAMES[name]: df.to_dict("records") for name, df in case_summary.items()
        },
        "per_seed": {JSON_NAMES[name]: df.to_dict("records") for name, df in case_frames.items()},
    }
    text = dyck_seed_tables.markdown(
        per_seed, run_table, rounding, list(PAIR), spec, training, draw
    )
    demos = dyck_seed_tables.CASE_DEMOS
    n_prompts = len(dyck_seed_tables.in_context_prompts(words, base.model.max_seq_len))
    case_parts = [
        f"## Case study on {n_prompts:,} in-context prompts of the same words ({draw} draw)",
        "The case_study probe's masses (probes.case_study) on every seed's checkpoints. As the "
        f"paper poses in-context Dyck, each prompt is a query after {demos} solved "
        f"demonstrations: the {len(words):,} words scored above, taken {demos + 1} at a time in "
        f"order, the groups that fit the models' {base.model.max_seq_len} tokens kept "
        f"({n_prompts:,} of {len(words) // (demos + 1):,}). BOS mass and demonstration-answer "
        "mass at the query's answer positions are the paper's quantities.",
        *case_seed_tables.over_seed_parts(case_summary, case_frames, "the prompts"),
        "Per seed: value [95% bootstrap interval over prompts]; the best head's index in brackets.",
        case_seed_tables.per_seed_part(case_frames["visits"]),
    ]
    return payload, text + "\n" + "\n\n".join(case_parts) + "\n"


def json_frames(frames: dict[str, pd.DataFrame]) -> dict[str, list[dict[str, Any]]]:
    """Frames as JSON records, under their JSON_NAMES (other names kept)."""
    return {JSON_NAMES.get(name, name): df.to_dict("records") for name, df in frames.items()}


def stack_frames(parts: Sequence[tuple[dict[str, Any], dict[str, pd.DataFrame]]]) -> dict:
    """{name: one frame} of each checkpoint's case-study frames, headed by its seed and model
    (the `who` of each part)."""
    out: dict[str, pd.DataFrame] = {}
    for name in parts[0][1]:
        frame = pd.concat([f[name].assign(**who) for who, f in parts], ignore_index=True)
        out[name] = frame[["seed", "model", *[c for c in frame if c not in ("seed", "model")]]]
    return out


def _recall_report(runs: Sequence[SeedRun], args: Any) -> tuple[dict[str, Any], str]:
    parts, models = [], []
    for run in runs:
        frames, figures = probe_run(run.folder, run.cfg, args.n_rows, args.seq_len)
        who = {"seed": run.cfg.seed, "model": run.cfg.arch}
        parts.append((who, frames))
        models.append(who | figures)
    per_seed = stack_frames(parts)
    per_model = pd.DataFrame(models)
    summary = recall_seed_tables.summarize(per_seed, per_model)
    payload = {
        "task": RECALL,
        "probe": case_study.PROBE.name,
        "n_rows": args.n_rows,
        "over_seeds": json_frames(summary),
        "per_seed": json_frames(per_seed) | {"by_model": models},
    }
    return payload, recall_seed_tables.markdown(summary, per_seed, per_model)


if __name__ == "__main__":
    run_cli(seeds_main)
