"""`python -m smelt_interp.commands.seeds --preset recall-pair --seeds 5 --out runs/recall-seeds`
(or `smelt-seeds`): train seeds 0..N-1 (TrainConfig.seed) of both models of a pair preset into
OUT/seed-{s}/{baseline,smelt}, one run at a time, reusing every run already complete there
(and resuming one that stopped); then probe each final checkpoint on held-out
associative-recall rows with the case_study probe and the head ablation
(probes.head_ablation), and write OUT/seeds.json and OUT/seeds.md: each figure as the mean over
seeds with a 95% t interval, and per seed with the probe's bootstrap interval over rows. Every
checkpoint is measured on the same held-out rows, so the spread over seeds is the training
seed's alone.

Single-seed figures flip between seeds; the spread over seeds is the interval that says how far
another run may land."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from smelt_interp.atomic import atomic_write_many, json_text
from smelt_interp.checkpoint import load_checkpoint, read_info
from smelt_interp.cli import ArgumentParser, int_at_least, run_cli
from smelt_interp.commands import seed_figures
from smelt_interp.data.assoc_recall import AssocRecallSpec
from smelt_interp.errors import CheckpointError, RunFolderError
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes import case_study
from smelt_interp.probes.head_ablation import ablate_heads
from smelt_interp.probes.inputs import ProbeInputs, training_recall_spec
from smelt_interp.probes.registry import ProbeOptions
from smelt_interp.train.__main__ import build_config
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import PAIR, PRESETS
from smelt_interp.train.run_folder import CKPT_FILE, METRICS_FILE, STATE_FILE, check_folder_path
from smelt_interp.train.state import read_state
from smelt_interp.train.trainer import Trainer, pair_configs

RESULT_JSON = "seeds.json"
RESULT_MD = "seeds.md"
DEFAULT_SEEDS = 5
DEFAULT_ROWS = 64


def seed_dir(out: Path, seed: int) -> Path:
    return out / f"seed-{seed}"


def run_configs(base: TrainConfig, n_seeds: int, out: Path) -> dict[Path, TrainConfig]:
    """{run folder: its config} for every seed and model, in training order."""
    runs = {}
    for seed in range(n_seeds):
        for arch, cfg in pair_configs(base.with_overrides({"seed": seed})).items():
            runs[seed_dir(out, seed) / arch] = cfg
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
        if info.final and info.step == cfg.steps:
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
        return TrainConfig.from_dict(saved) == cfg
    except Exception:  # a config this version cannot read is not this run's
        return False


def train_seconds(run_dir: Path, cfg: TrainConfig) -> float:
    """Seconds the run spent in optimizer steps, from its metrics log (each train record's
    tokens per step over its tokens/s): the training time, evaluation and saving left out."""
    total = 0.0
    with open(run_dir / METRICS_FILE, encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec.get("event") == "train" and "branch" not in rec and rec.get("tokens_per_s"):
                total += cfg.tokens_per_step / rec["tokens_per_s"]
    return total


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


def probe_run(
    run_dir: Path, cfg: TrainConfig, n_rows: int, seq_len: int | None
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """(per (layer, visit) figures, model figures) of a run's final checkpoint."""
    ckpt = run_dir / CKPT_FILE
    model, info = load_checkpoint(ckpt)
    spec = training_recall_spec(info.train_config)
    length = min(seq_len or default_length(model), model.cfg.max_seq_len)
    inputs = recall_inputs(model, spec, n_rows, length)
    tables = case_study.run(model, inputs, ProbeOptions())
    rows = inputs.recall_rows()
    heads = seed_figures.answer_heads(tables)  # the ablated heads are chosen from the probe's
    ablation = ablate_heads(model, rows, spec, masses=heads)
    figures = seed_figures.model_figures(tables, heads, ablation.table)
    figures |= {
        "tokens": int(info.meta.get("tokens", 0)),
        "train_seconds": train_seconds(run_dir, cfg),
    }
    return seed_figures.visit_figures(heads), figures


def source_commit() -> str:
    """The git commit of this checkout (with "+changes" when the tree differs from it), or
    "unknown" outside a git checkout: results say which code measured them."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
        )
    except OSError:
        return "unknown"
    if head.returncode != 0 or not head.stdout.strip():
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def default_length(model: SmeltModel) -> int:
    """The rows' default length: the model's context, at most 256 tokens."""
    return min(256, model.cfg.max_seq_len)


def seeds_main(argv: Sequence[str] | None = None) -> int:
    """Train and probe N seeds of a pair preset; write OUT/seeds.json and OUT/seeds.md."""
    p = ArgumentParser(
        prog="python -m smelt_interp.commands.seeds",
        description="Train N seeds of a preset's Baseline/SMELT pair and report the case study "
        "over seeds.",
    )
    p.add_argument("--preset", default="recall-pair", help=f"one of {', '.join(sorted(PRESETS))}")
    p.add_argument("--seeds", type=int_at_least(1), default=DEFAULT_SEEDS, help="seeds 0..N-1")
    p.add_argument(
        "--out", type=Path, default=None, help="output folder (default runs/<preset>-seeds)"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a training field for every run, e.g. --set steps=200",
    )
    p.add_argument("--n-rows", type=int_at_least(1), default=DEFAULT_ROWS, help="held-out rows")
    p.add_argument("--seq-len", type=int_at_least(2), default=None, help="tokens per row")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    base = build_config(args.preset, None, list(args.overrides))
    out = check_folder_path(args.out or Path("runs") / f"{args.preset}-seeds")
    for place in (out / RESULT_JSON, out / RESULT_MD):
        if place.exists() and not place.is_file():
            raise RunFolderError(f"{place} is not a regular file; choose another --out")
    runs = run_configs(base, args.seeds, out)
    states = {run_dir: run_state(run_dir, cfg) for run_dir, cfg in runs.items()}  # all first
    for run_dir, cfg in runs.items():
        if states[run_dir] == "complete":
            print(f"{run_dir}: complete, reused", flush=True)
            continue
        resume = states[run_dir] == "resumable"
        Trainer(cfg, run_dir, resume=resume, progress=not args.quiet).run()
        print(f"{run_dir}: trained", flush=True)
    visits, models = [], []
    for run_dir, cfg in runs.items():
        by_visit, figures = probe_run(run_dir, cfg, args.n_rows, args.seq_len)
        who = {"seed": cfg.seed, "model": cfg.arch}
        visits.append(by_visit.assign(**who))
        models.append(who | figures)
    per_visit = pd.concat(visits, ignore_index=True)
    per_visit = per_visit[["seed", "model", *[c for c in per_visit if c not in ("seed", "model")]]]
    per_model = pd.DataFrame(models)
    summary = seed_figures.summarize(per_visit, per_model)
    commit = source_commit()
    title = f"{args.preset}: {args.seeds} seeds (measured with the code of commit {commit})"
    payload = {
        "preset": args.preset,
        "seeds": list(range(args.seeds)),
        "overrides": list(args.overrides),
        "models": list(PAIR),
        "probe": case_study.PROBE.name,
        "commit": commit,
        "n_rows": args.n_rows,
        "over_seeds": {name: df.to_dict("records") for name, df in summary.items()},
        "per_seed": {"by_visit": per_visit.to_dict("records"), "by_model": models},
    }
    text = seed_figures.markdown(summary, per_visit, per_model, title)
    atomic_write_many({out / RESULT_JSON: json_text(payload, indent=1), out / RESULT_MD: text})
    print(text)
    print(f"wrote {out / RESULT_JSON} and {out / RESULT_MD}")
    return 0


if __name__ == "__main__":
    run_cli(seeds_main)
