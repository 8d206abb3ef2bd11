"""A scaling ladder: sizes x architectures x decay horizons, each Baseline/SMELT pair matched
on budgets, written as the runs table (`arch, size, F, S, D, N, loss`) that
`smelt_interp.analysis.scaling` fits. Both models of a size carry their pair's one S (the
Baseline's, `budget.pair_sparsity`), so the fit sees a pair in one S cell; `restate_sparsity`
recomputes S for a table written before that rule. The command: `python -m smelt_interp.train
ladder`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from smelt_interp.atomic import atomic_write_text
from smelt_interp.errors import RunsError
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.metrics import read_metrics
from smelt_interp.train.presets import PAIR
from smelt_interp.train.run_folder import check_folder_path
from smelt_interp.train.trainer import METRICS_FILE, Trainer

# Baseline shapes of the CPU ladder, smallest first; each gets a matched SMELT twin.
CPU_SIZES: list[dict[str, Any]] = [
    {
        "d_model": 48,
        "n_layers": 4,
        "n_heads": 2,
        "n_kv_heads": 1,
        "d_head": 24,
        "n_experts": 8,
        "top_k": 2,
        "d_expert": 48,
    },
    {
        "d_model": 72,
        "n_layers": 4,
        "n_heads": 3,
        "n_kv_heads": 1,
        "d_head": 24,
        "n_experts": 8,
        "top_k": 2,
        "d_expert": 72,
    },
    {
        "d_model": 96,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 2,
        "d_head": 24,
        "n_experts": 8,
        "top_k": 2,
        "d_expert": 96,
    },
    {
        "d_model": 128,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 2,
        "d_head": 32,
        "n_experts": 8,
        "top_k": 2,
        "d_expert": 128,
    },
]

# Language modelling on code and arithmetic, three horizons from one stable run per model.
CPU_LADDER: dict[str, Any] = {
    "data": {"code": 0.7, "arith": 0.3},
    "seq_len": 128,
    "batch_size": 16,
    "lr": 3e-3,
    "warmup_steps": 20,
    "steps": 480,
    "branches": [120, 240],
    "decay_fraction": 0.25,
    "eval_every": 10_000,
    "ckpt_every": 60,
    "eval_rows": 48,
    "dyck_eval_n": 0,
    "threads": 2,
}

RUNS_FILE = "runs.csv"


def pair_S(cfg: TrainConfig) -> float:
    """The S both models of a ladder size carry: the Baseline shape's (cfg.model is the Baseline
    for either arch; SMELT is matched to it, so Match.sparsity is this same number)."""
    from smelt_interp.budget import sparsity

    return sparsity(cfg.model, cfg.seq_len)


def ladder_rows(out_dir: Path, size: int, cfg: TrainConfig) -> list[dict[str, Any]]:
    """One row per horizon of one trained model, read from its metrics log."""
    from smelt_interp.budget import Budget

    model_cfg = cfg.model_config()
    budget = Budget.of(model_cfg, cfg.seq_len)
    S = pair_S(cfg)
    rows = []
    for rec in read_metrics(out_dir / METRICS_FILE):
        if rec.get("event") != "eval":
            continue
        horizon = rec.get("branch", rec["step"])
        if horizon not in cfg.horizons or rec["step"] != horizon:
            continue
        losses = [v for k, v in rec.items() if k.startswith("loss/")]
        rows.append(
            {
                "arch": cfg.arch,
                "size": size,
                "d_model": model_cfg.d_model,
                "n_experts": model_cfg.n_experts,
                "N": budget.params,
                "F": budget.flops,
                "S": S,
                "D": rec["tokens"],
                "steps": horizon,
                "loss": sum(losses) / len(losses),
                **{k: v for k, v in rec.items() if k.startswith("loss/")},
            }
        )
    return rows


def run_ladder(
    base: dict[str, Any],
    sizes: Sequence[dict[str, Any]],
    out_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
) -> pd.DataFrame:
    """Train every (size, arch) and write `<out>/runs.csv`; returns the table."""
    out_dir = check_folder_path(out_dir)  # before the first run trains, not after it
    rows: list[dict[str, Any]] = []
    for index, shape in enumerate(sizes):
        for arch in PAIR:
            cfg = TrainConfig.from_dict(
                {**base, "model": {**base.get("model", {}), **shape}, "arch": arch}
            )
            run_dir = out_dir / f"size{index}" / arch
            done = (run_dir / "ckpt.pt").exists() and resume and _finished(run_dir, cfg)
            if not done:
                Trainer(cfg, run_dir, resume=resume, progress=progress).run()
            rows += ladder_rows(run_dir, index, cfg)
            atomic_write_text(out_dir / RUNS_FILE, pd.DataFrame(rows).to_csv(index=False))
    return pd.DataFrame(rows)


def _finished(run_dir: Path, cfg: TrainConfig) -> bool:
    steps = {r["steps"] for r in ladder_rows(run_dir, 0, cfg)}
    return steps == set(cfg.horizons)


def restate_sparsity(
    runs: pd.DataFrame,
    base: dict[str, Any] = CPU_LADDER,
    sizes: Sequence[dict[str, Any]] = CPU_SIZES,
) -> pd.DataFrame:
    """A copy of a ladder's runs table with S recomputed from the configs (no retraining): each
    row gets its pair's S. The configs are rebuilt from `base` and `sizes` and each row's
    d_model, n_experts, N and F must be the ones they give (else a one-line RunsError), so a
    table from another ladder is refused rather than restated wrongly."""
    missing = {"arch", "size", "d_model", "n_experts", "N", "F", "S"} - set(runs.columns)
    if missing:
        raise RunsError(f"not a ladder runs table: it lacks {', '.join(sorted(missing))}")
    from smelt_interp.budget import Budget

    restated = []
    cache: dict[tuple[int, str], tuple[dict[str, float], float]] = {}
    for i, row in enumerate(runs.to_dict("records")):
        size, arch = int(row["size"]), str(row["arch"])
        if not 0 <= size < len(sizes) or arch not in PAIR:
            raise RunsError(f"row {i}: no ladder config for size {size}, arch {arch!r}")
        if (size, arch) not in cache:
            cfg = TrainConfig.from_dict(
                {**base, "model": {**base.get("model", {}), **sizes[size]}, "arch": arch}
            )
            model_cfg = cfg.model_config()
            b = Budget.of(model_cfg, cfg.seq_len)
            shape = {
                "d_model": model_cfg.d_model,
                "n_experts": model_cfg.n_experts,
                "N": b.params,
                "F": b.flops,
            }
            cache[size, arch] = shape, pair_S(cfg)
        shape, S = cache[size, arch]
        for key, value in shape.items():
            if not abs(float(row[key]) - value) <= 1e-9 * abs(value):
                raise RunsError(
                    f"row {i} ({arch}, size {size}): {key} is {row[key]:g} but the ladder's "
                    f"config gives {value:g}"
                )
        restated.append(S)
    return runs.assign(S=restated)
