"""A scaling ladder: sizes x architectures x decay horizons, each Baseline/SMELT pair matched
on budgets, written as the runs table (`arch, size, F, S, D, N, loss`) that
`smelt_interp.analysis.scaling` fits. Both models of a size carry their pair's one S (the
Baseline's, `budget.pair_sparsity`), so the fit sees a pair in one S cell. The command:
`python -m smelt_interp.train ladder`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from smelt_interp.config import ModelConfig
from smelt_interp.files import atomic_write_text
from smelt_interp.provenance import CKPT_FILE, METRICS_FILE
from smelt_interp.results import markdown_table
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.metrics import read_metrics
from smelt_interp.train.presets import PAIR
from smelt_interp.train.run_folder import check_folder_path
from smelt_interp.train.trainer import Trainer

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
    ModelConfig().shape(),  # the default pair's shape
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

    return sparsity(cfg.model, cfg.batch.seq_len)


def ladder_rows(out_dir: Path, size: int, cfg: TrainConfig) -> list[dict[str, Any]]:
    """One row per horizon of one trained model, read from its metrics log."""
    from smelt_interp.budget import Budget

    model_cfg = cfg.model_config()
    budget = Budget.of(model_cfg, cfg.batch.seq_len)
    S = pair_S(cfg)
    rows = []
    for rec in read_metrics(out_dir / METRICS_FILE):
        if rec.get("event") != "eval":
            continue
        horizon = rec.get("branch", rec["step"])
        if horizon not in cfg.schedule.horizons or rec["step"] != horizon:
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
            done = (run_dir / CKPT_FILE).exists() and resume and _finished(run_dir, cfg)
            if not done:
                Trainer(cfg, run_dir, resume=resume, progress=progress).run()
            rows += ladder_rows(run_dir, index, cfg)
            atomic_write_text(out_dir / RUNS_FILE, pd.DataFrame(rows).to_csv(index=False))
    return pd.DataFrame(rows)


def loss_table(runs: pd.DataFrame) -> str:
    """A ladder's runs table as the README shows it: per size, each architecture's held-out
    loss at every horizon and SMELT - Baseline at the last (losses to 3 decimals)."""
    horizons = sorted(runs["steps"].unique())
    last = horizons[-1]
    at = " / ".join(str(h) for h in horizons)
    header = ["size (Baseline d_model, N)"]
    header += [f"{a} loss at {at} steps" for a in PAIR] + [f"{PAIR[1]} - {PAIR[0]} at {last}"]
    rows = []
    for size, part in runs.groupby("size"):
        loss = part.set_index(["arch", "steps"])["loss"]
        base = part[part["arch"] == PAIR[0]].iloc[0]
        row = [f"{size} (d {base['d_model']}, {base['N'] / 1e6:.2f}M)"]
        row += [" / ".join(f"{loss[a, h]:.3f}" for h in horizons) for a in PAIR]
        rows.append([*row, f"{loss[PAIR[1], last] - loss[PAIR[0], last]:+.3f}"])
    return markdown_table(header, rows)


def _finished(run_dir: Path, cfg: TrainConfig) -> bool:
    steps = {r["steps"] for r in ladder_rows(run_dir, 0, cfg)}
    return steps == set(cfg.schedule.horizons)
