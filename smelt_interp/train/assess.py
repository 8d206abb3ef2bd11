"""The final report of trained checkpoints (`python -m smelt_interp.train eval CKPT ...`).

Each checkpoint is measured on the held-out data of the run that made it (its saved
`train_config`): loss per domain, and Dyck exact match by greedy generation on `--n` fresh
held-out examples (by default 1,000, drawn with a seed the trainer's periodic evaluation does not
use), with a 95% Wilson interval so a reader can see how far a figure is from a threshold."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from smelt_interp.checkpoint import CheckpointInfo, load_checkpoint
from smelt_interp.data.dyck_eval import exact_match_accuracy
from smelt_interp.errors import CheckpointError, ConfigError
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.data import TrainingData
from smelt_interp.train.evaluate import heldout_dyck_examples, heldout_loss

REPORT_SEED_OFFSET = 1000  # the trainer draws its eval examples with seed + 1


def wilson_interval(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion hits / n."""
    if n == 0:
        return (0.0, 1.0)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def train_config_of(info: CheckpointInfo) -> TrainConfig:
    """The TrainConfig saved with a checkpoint (trainer checkpoints carry one)."""
    if info.train_config is None:
        raise CheckpointError(
            f"{info.path}: has no training config; only checkpoints written by "
            f"`python -m smelt_interp.train` can be evaluated on their held-out data"
        )
    try:
        return TrainConfig.from_dict(info.train_config)
    except (ConfigError, TypeError) as exc:
        raise CheckpointError(f"{info.path}: invalid training config ({exc})") from None


@torch.no_grad()
def assess(
    path: str | Path, n_examples: int = 1000, seed: int | None = None, loss_rows: int = 64
) -> dict[str, Any]:
    """Held-out losses and greedy Dyck exact match of one trainer checkpoint."""
    path = Path(path)
    model, info = load_checkpoint(path)
    cfg = train_config_of(info)
    data = TrainingData(cfg)
    report: dict[str, Any] = {"checkpoint": str(path), "arch": cfg.arch, "step": info.step}
    for domain in data.eval_domains:
        report[f"loss/{domain}"] = heldout_loss(model, data.heldout(domain, loss_rows))
    draw_seed = cfg.seed + REPORT_SEED_OFFSET if seed is None else seed
    examples = heldout_dyck_examples(cfg, n_examples, draw_seed)
    if examples:
        accuracy = exact_match_accuracy(model, examples)
        hits = round(accuracy * n_examples)
        low, high = wilson_interval(hits, n_examples)
        report.update(
            {
                "dyck_exact_match": accuracy,
                "dyck_n": n_examples,
                "dyck_seed": draw_seed,
                "dyck_ci95": [low, high],
            }
        )
    return report


def format_report(report: dict[str, Any]) -> str:
    parts = [f"{report['arch']} {report['checkpoint']} (step {report['step']})"]
    if "dyck_exact_match" in report:
        low, high = report["dyck_ci95"]
        parts.append(
            f"Dyck exact match {report['dyck_exact_match']:.1%} of {report['dyck_n']} "
            f"held-out (95% CI {low:.1%}-{high:.1%})"
        )
    parts += [f"{k} {v:.4f}" for k, v in report.items() if k.startswith("loss/")]
    return "  ".join(parts)
