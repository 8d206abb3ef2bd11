"""The final report of trained checkpoints (`python -m smelt_interp.train eval CKPT ...`).

Each checkpoint is measured on the held-out data of the run that made it (its saved
`train_config`): loss per domain, and Dyck exact match by greedy generation on `--n` fresh
held-out examples (by default 1,000, drawn with a seed the trainer's periodic evaluation does not
use), with a 95% Wilson interval so a reader can see how far a figure is from a threshold. The
accuracy is also split by how deep each query nests (`data.dyck.DEPTH_BUCKETS`); random draws
rarely nest deep, so `per_depth` draws that many examples in each depth range instead.

With `shards` (`train eval --shards DIR`), the held-out loss of every domain of a prepared
folder is measured too, on the folder's held-out shards; a folder of another tokenizer than the
checkpoint's is refused in one line."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from smelt_interp.checkpoint import CheckpointInfo, load_checkpoint
from smelt_interp.data.bpe import checkpoint_tokenizer, tokenizer_hash, tokenizer_json
from smelt_interp.data.dyck import DyckExample, bucket_label, depth_bucket, make_dataset
from smelt_interp.data.shards import ShardSet, heldout_rows
from smelt_interp.errors import CheckpointError, ConfigError, DataError
from smelt_interp.measure.dyck_score import complete_many
from smelt_interp.measure.intervals import wilson_interval
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.data import DOMAINS, TrainingData
from smelt_interp.train.evaluate import heldout_dyck_examples, heldout_loss

REPORT_SEED_OFFSET = 1000  # a stream apart from the trainer's (data.dyck.DRAW_SEED)


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


def accuracy_by_depth(examples: list[DyckExample], correct: list[bool]) -> list[dict[str, Any]]:
    """Per DEPTH_BUCKETS range that holds an example: its label, count, exact match and 95%
    Wilson interval, in depth order."""
    groups: dict[tuple[int, int | None], list[bool]] = {}
    for example, hit in zip(examples, correct, strict=True):
        groups.setdefault(depth_bucket(example.depth), []).append(hit)
    rows = []
    for bucket in sorted(groups):
        hits = groups[bucket]
        rows.append(
            {
                "depth": bucket_label(bucket),
                "n": len(hits),
                "exact_match": sum(hits) / len(hits),
                "ci95": list(wilson_interval(sum(hits), len(hits))),
            }
        )
    return rows


def open_shards_for(folder: str | Path, info: CheckpointInfo) -> ShardSet:
    """A prepared folder whose tokenizer is the checkpoint's own (else one ShardError line)."""
    tokenizer = checkpoint_tokenizer(info.meta)
    return ShardSet(folder, expect_hash=tokenizer_hash(tokenizer_json(tokenizer)))


def shard_losses(
    model: SmeltModel, shards: ShardSet, row_len: int, loss_rows: int
) -> dict[str, float]:
    """Held-out next-token loss of each domain of `shards`: the token-weighted mean over the
    first `loss_rows` rows of `row_len` tokens of its held-out shards."""
    domains = shards.domains("heldout")
    if not domains:
        raise DataError(f"{shards.folder}: no held-out shards to evaluate on")
    return {d: heldout_loss(model, heldout_rows(shards, d, row_len, loss_rows)) for d in domains}


@torch.no_grad()
def assess(
    path: str | Path,
    n_examples: int = 1000,
    seed: int | None = None,
    loss_rows: int = 64,
    per_depth: int | None = None,
    max_depth: int | None = None,
    data_paths: Sequence[str] = (),
    shards: str | Path | None = None,
) -> dict[str, Any]:
    """Held-out losses and greedy Dyck exact match of one trainer checkpoint, overall and by
    nesting depth: on `n_examples` random held-out examples, or with `per_depth`, on that many
    in each depth range the run's Dyck spec reaches. `max_depth` draws words nesting up to that
    depth instead of the run's own limit (how a model fares beyond what it was trained on).
    User text is read only from `data_paths`, files the user names: the paths a checkpoint's
    train_config names are its content, not a choice of what to read, so without `data_paths`
    the run's user-text domains are left out (listed under `user_data_not_read`). The same
    holds for a shard folder: only `shards`, a folder the user names, is read (`loss/DOMAIN` for
    each of its held-out domains)."""
    path = Path(path)
    model, info = load_checkpoint(path)
    cfg = train_config_of(info)
    shard_set = open_shards_for(shards, info) if shards else None
    skipped = list(cfg.corpus.paths) if cfg.corpus.paths and not data_paths else []
    # A shard folder a checkpoint names is a path inside the file: never read, like its paths.
    skipped += [cfg.corpus.shards] if cfg.corpus.shards and shard_set is None else []
    if cfg.corpus.paths or cfg.corpus.shards:
        weights = (
            cfg.corpus.weights
            if data_paths and not cfg.corpus.shards
            else {d: w for d, w in cfg.corpus.weights.items() if d in DOMAINS}
        )
        corpus = dataclasses.replace(cfg.corpus, paths=list(data_paths), shards="", weights=weights)
        cfg = dataclasses.replace(cfg, corpus=corpus)
    data = TrainingData(cfg)
    if max_depth is not None and cfg.corpus.weights.get("dyck", 0) > 0:
        deeper = dataclasses.replace(cfg.corpus.dyck, max_depth=max_depth)
        cfg = dataclasses.replace(cfg, corpus=dataclasses.replace(cfg.corpus, dyck=deeper))
    report: dict[str, Any] = {"checkpoint": str(path), "arch": cfg.arch, "step": info.step}
    if skipped:
        report["user_data_not_read"] = skipped
    for domain in data.eval_domains:
        report[f"loss/{domain}"] = heldout_loss(model, data.heldout(domain, loss_rows))
    if shard_set is not None:
        row_len = min(cfg.batch.seq_len, model.cfg.max_seq_len)
        for domain, loss in shard_losses(model, shard_set, row_len, loss_rows).items():
            report[f"loss/{domain}"] = loss
        report["shards"] = str(shard_set.folder)
    draw_seed = cfg.seed + REPORT_SEED_OFFSET if seed is None else seed
    if per_depth is None or cfg.corpus.weights.get("dyck", 0) <= 0:
        examples = heldout_dyck_examples(cfg, n_examples, draw_seed)
    else:
        examples = make_dataset(
            per_depth,
            spec=cfg.corpus.dyck.task_draw(),
            split="heldout",
            seed=draw_seed,
            n_demos=cfg.eval.dyck_demos,
            by_depth=True,
        )
    if examples:
        answers = complete_many(model, examples)
        correct = [answer == ex.answer for answer, ex in zip(answers, examples)]
        hits = sum(correct)
        low, high = wilson_interval(hits, len(examples))
        report.update(
            {
                "dyck_exact_match": hits / len(examples),
                "dyck_n": len(examples),
                "dyck_sample": "random" if per_depth is None else f"{per_depth} per depth range",
                "dyck_seed": draw_seed,
                "dyck_max_depth": cfg.corpus.dyck.max_depth,
                "dyck_ci95": [low, high],
                "dyck_by_depth": accuracy_by_depth(examples, correct),
            }
        )
    return report


def format_report(report: dict[str, Any]) -> str:
    parts = [f"{report['arch']} {report['checkpoint']} (step {report['step']})"]
    if "dyck_exact_match" in report:
        low, high = report["dyck_ci95"]
        parts.append(
            f"Dyck exact match {report['dyck_exact_match']:.1%} of {report['dyck_n']} "
            f"held-out, depth <= {report['dyck_max_depth']} (95% CI {low:.1%}-{high:.1%})"
        )
    parts += [f"{k} {v:.4f}" for k, v in report.items() if k.startswith("loss/")]
    lines = ["  ".join(parts)]
    if report.get("dyck_by_depth"):
        cells = [
            f"{row['depth']} {row['exact_match']:.1%} (n {row['n']}, "
            f"{row['ci95'][0]:.0%}-{row['ci95'][1]:.0%})"
            for row in report["dyck_by_depth"]
        ]
        lines.append("  by nesting depth: " + " | ".join(cells))
    return "\n".join(lines)
