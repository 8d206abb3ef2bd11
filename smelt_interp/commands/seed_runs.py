"""The runs of the seeds command (commands.seeds): each seed's Baseline and SMELT configs,
typed copies of the one TrainConfig the command built, the rounding check's reruns after them,
what each run folder already holds (a complete run, a resumable one, or nothing), and the
training of them in turn (train_runs, which commands.computed_seeds shares)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smelt_interp.checkpoint import read_info
from smelt_interp.commands.run_log import train_seconds
from smelt_interp.errors import CheckpointError, ConfigError, RunFolderError
from smelt_interp.provenance import CKPT_FILE, METRICS_FILE, task_of_mix
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import PAIR
from smelt_interp.train.run_folder import STATE_FILE
from smelt_interp.train.state import read_state
from smelt_interp.train.trainer import Trainer, pair_configs

RECALL, DYCK = "assoc_recall", "dyck"  # the tasks the command measures


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
        for arch, cfg in pair_configs(dataclasses.replace(base, seed=seed)).items():
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
            runtime = dataclasses.replace(base.runtime, threads=rounding_threads)
            rerun = dataclasses.replace(base, seed=seed, runtime=runtime)
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


def train_runs(
    runs: Sequence[SeedRun], states: Mapping[Path, str], *, progress: bool = True
) -> None:
    """Train `runs` one at a time in order, given each folder's run_state (checked for every run
    before any is trained): a complete run is reused (its log read now, not after the
    training), a resumable one resumed, a new one trained; one line each says which."""
    for run in runs:
        if states[run.folder] == "complete":
            train_seconds(run.folder, run.cfg)  # its log is read now, not after the training
            print(f"{run.folder}: complete, reused", flush=True)
            continue
        resume = states[run.folder] == "resumable"
        Trainer(run.cfg, run.folder, resume=resume, progress=progress).run()
        print(f"{run.folder}: trained", flush=True)


def _same_config(saved: dict[str, Any], cfg: TrainConfig) -> bool:
    try:
        return TrainConfig.from_dict(saved).same_run(cfg)
    except Exception:  # a config this version cannot read is not this run's
        return False
