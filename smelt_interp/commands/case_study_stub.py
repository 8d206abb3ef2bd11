"""A stand-in for the `case_study` probe on the associative-recall task, used by the seeds
command only while that probe is not registered: the contract's `heads` (bos_mass, demo_mass),
`non_answer`, `accuracy` (next_token) and `sink` tables, each statistic with a 95% percentile
bootstrap interval over rows. It measures the masses with probes.head_ablation's reducer; once
probes/case_study.py is registered the seeds command calls it instead, and this module goes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from smelt_interp.data.assoc_recall import RecallPositions
from smelt_interp.model.sink import WINDOW, sink_record
from smelt_interp.model.transformer import SmeltModel, hook_name
from smelt_interp.probes.common import capture

MAX_DEMOS = 4
N_RESAMPLES = 1000
TASK = "assoc_recall"


def _n_demos(positions: RecallPositions) -> torch.Tensor:
    """[b, T]: earlier occurrences of each query's trigger (capped at MAX_DEMOS); -1 where the
    query is neither an answer position nor a first occurrence."""
    count = positions.demos.sum(dim=-1).clamp(max=MAX_DEMOS)
    return torch.where(positions.answer | positions.first, count, torch.full_like(count, -1))


def _boot(sums: np.ndarray, counts: np.ndarray, seed: int) -> tuple[np.ndarray, ...]:
    """(point, lo, hi) of sum(sums) / sum(counts) over rows (axis 0), resampling rows."""
    rng = np.random.default_rng(seed)
    n = sums.shape[0]
    weights = rng.multinomial(n, np.full(n, 1.0 / n), size=N_RESAMPLES).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        point = sums.sum(axis=0) / counts.sum(axis=0)
        boot = np.tensordot(weights, sums, axes=1) / np.tensordot(weights, counts, axes=1)
    lo, hi = np.nanpercentile(boot, [2.5, 97.5], axis=0)
    return point, lo, hi


def stub_tables(
    model: SmeltModel, rows: torch.Tensor, positions: RecallPositions, seed: int = 0
) -> dict[str, pd.DataFrame]:
    """The contract's tables for `rows` (see the module docstring)."""
    model.eval()
    names = [hook_name(layer, visit, "attn.hook_pattern") for layer, visit in model.schedule]
    logits, cache = capture(model, rows, names)
    demos_of = _n_demos(positions)
    buckets = range(MAX_DEMOS + 1)
    b, h = rows.shape[0], model.cfg.n_heads
    # per row: [visits, heads, bucket, (bos, demo)] sums at answer/first positions, counts
    ans = np.zeros((b, len(names), h, len(buckets), 2))
    ans_n = np.zeros((b, len(buckets)))
    non = np.zeros((b, len(names), h))
    hits = np.zeros((b, len(buckets)))
    right = (logits.argmax(dim=-1) == positions.targets).double()
    for k in buckets:
        at = (demos_of == k).double()  # [b, T]
        ans_n[:, k] = at.sum(dim=1).numpy()
        hits[:, k] = (right * at).sum(dim=1).numpy()
    non_n = positions.non_answer.double().sum(dim=1).numpy()
    for i, name in enumerate(names):
        pattern = cache[name].double()  # [b, h, q, k]
        bos = pattern[..., 0]
        demo = (pattern * positions.demos[:, None].double()).sum(dim=-1)
        non[:, i] = (bos * positions.non_answer[:, None]).sum(dim=2).numpy()
        for k in buckets:
            at = (demos_of == k)[:, None].double()
            ans[:, i, :, k, 0] = (bos * at).sum(dim=2).numpy()
            ans[:, i, :, k, 1] = (demo * at).sum(dim=2).numpy()
    depth = {pair: d for d, pair in enumerate(model.schedule)}
    mass = _boot(ans, ans_n[:, None, None, :, None], seed)
    heads = [
        {"task": TASK, "n_demos": k, "layer": layer, "visit": visit, "depth": depth[layer, visit]}
        | {"head": j}
        | {
            f"{stat}{suffix}": float(part[i, j, k, s])
            for s, stat in enumerate(("bos_mass", "demo_mass"))
            for suffix, part in zip(("", "_lo", "_hi"), mass)
        }
        for i, (layer, visit) in enumerate(model.schedule)
        for j in range(h)
        for k in buckets
        if ans_n[:, k].sum() > 0
    ]
    bos = _boot(non, non_n[:, None, None], seed)
    non_answer = [
        {"task": TASK, "layer": layer, "visit": visit, "depth": depth[layer, visit], "head": j}
        | {f"bos_mass{s}": float(part[i, j]) for s, part in zip(("", "_lo", "_hi"), bos)}
        for i, (layer, visit) in enumerate(model.schedule)
        for j in range(h)
    ]
    acc = _boot(hits, ans_n, seed)
    accuracy = [
        {"task": TASK, "n_demos": k, "n": int(ans_n[:, k].sum()), "kind": "next_token"}
        | {name: float(part[k]) for name, part in zip(("accuracy", "lo", "hi"), acc)}
        for k in buckets
        if ans_n[:, k].sum() > 0
    ]
    windows = rows[:, :WINDOW]
    sink = sink_record(model, windows, torch.ones_like(windows, dtype=torch.bool))
    return {
        "heads": pd.DataFrame(heads),
        "non_answer": pd.DataFrame(non_answer),
        "accuracy": pd.DataFrame(accuracy),
        "sink": pd.DataFrame([{"task": TASK, f"sink03_{WINDOW}": sink[f"sink03_{WINDOW}"]}]),
    }
