"""Routing overlap: at each looped layer, the number of experts a token's top-k sets share
between two consecutive visits (0..k), averaged over valid tokens, with its distribution and
its chance level from the usage measured here, sum_e k^2 u0(e) u1(e) (two independent top-k
sets drawn with each visit's expert shares, measure.chance; k^2 / E is its even-use case,
kept beside it); and expert usage per (layer, visit): the share of routed slots each expert
takes. The paper's "2-3 of 8" counts shared experts of a top-8; beside another k it says so.

    python -m smelt_interp.probes.routing ckpt.pt [--data dyck] [--compare OTHER_CKPT] [--csv OUT]
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from smelt_interp import paper
from smelt_interp.errors import ProbeError
from smelt_interp.measure.batching import (
    DEFAULT_BATCH,
    Accumulator,
    capture,
    make_batch,
    micro_batches,
    visit_names,
)
from smelt_interp.measure.chance import normalised_count, routing_chance
from smelt_interp.model.protocol import LoopedModel, hook_name
from smelt_interp.probes.common import depth_index, require_looped
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary

INDICES = "moe.hook_expert_indices"


def overlap_counts(idx_a: torch.Tensor, idx_b: torch.Tensor) -> torch.Tensor:
    """Experts in both top-k sets, per token: [b, T, k] x2 -> [b, T] ints in 0..k."""
    return (idx_a[..., :, None] == idx_b[..., None, :]).any(dim=-1).sum(dim=-1)


def _visit_pairs(model: LoopedModel) -> list[tuple[int, int, int]]:
    """(layer, visit, next visit) for every looped layer and consecutive pair of its visits."""
    return [
        (layer, v, v + 1)
        for layer in model.cfg.looped_layers
        for v in range(model.cfg.visits_of(layer) - 1)
    ]


def _collect(
    model: LoopedModel, tokens: torch.Tensor, lengths, batch_size: int
) -> tuple[Accumulator, Accumulator]:
    """Overlap histograms per visit pair and expert counts per (layer, visit), over valid tokens."""
    require_looped(model, "routing overlap")
    cfg = model.cfg
    if cfg.n_experts <= 1:
        name = cfg.name or "this model"
        raise ProbeError(f"routing overlap needs routed experts, but {name} has a dense MLP")
    batch = make_batch(model, tokens, lengths)
    names = visit_names(model, model.schedule, INDICES)
    overlap, usage = Accumulator(), Accumulator()
    for mb in micro_batches(batch, batch_size, "routing"):
        _, cache = capture(model, mb.tokens, names)
        idx = {lv: cache[hook_name(*lv, INDICES)] for lv in model.schedule}
        n_tokens = mb.valid.sum()
        for layer, visit in model.schedule:
            chosen = idx[layer, visit][mb.valid]  # [n, k]
            usage.add(
                (layer, visit),
                torch.bincount(chosen.reshape(-1), minlength=cfg.n_experts),
                chosen.numel(),
            )
        for layer, a, b in _visit_pairs(model):
            shared = overlap_counts(idx[layer, a], idx[layer, b])[mb.valid]
            overlap.add((layer, a, b), torch.bincount(shared, minlength=cfg.top_k + 1), n_tokens)
    return overlap, usage


def measure(
    model: LoopedModel,
    tokens: torch.Tensor,
    lengths: torch.Tensor | Sequence[int] | None = None,
    *,
    batch_size: int = DEFAULT_BATCH,
) -> pd.DataFrame:
    """One row per looped layer and visit pair. Columns: layer, visit, other_visit, top_k,
    n_experts, overlap (mean shared experts), chance (sum_e k^2 u_a(e) u_b(e) from the two
    visits' measured expert usage, measure.chance), chance_even_use (k^2/E), n_tokens,
    overlap_norm ((overlap - chance) / (k - chance)), p_0 .. p_k (share of tokens sharing exactly
    that many experts). Raises ProbeError on a Baseline."""
    return tables(model, tokens, lengths, batch_size=batch_size)["overlap"]


def tables(
    model: LoopedModel,
    tokens: torch.Tensor,
    lengths: torch.Tensor | Sequence[int] | None = None,
    *,
    batch_size: int = DEFAULT_BATCH,
) -> Tables:
    """{'overlap': see measure, 'usage': layer, visit, depth, expert, share (of routed slots)}."""
    overlap, usage = _collect(model, tokens, lengths, batch_size)
    cfg = model.cfg
    k, e = cfg.top_k, cfg.n_experts
    rows = []
    for layer, a, b in _visit_pairs(model):
        dist = overlap.mean((layer, a, b))
        row = {
            "layer": layer,
            "visit": a,
            "other_visit": b,
            "top_k": k,
            "n_experts": e,
            "overlap": float((dist * torch.arange(k + 1)).sum()),
            "chance": routing_chance(usage.mean((layer, a)), usage.mean((layer, b)), k),
            "chance_even_use": k * k / e,
            "n_tokens": int(overlap.counts[layer, a, b]),
        }
        row["overlap_norm"] = normalised_count(row["overlap"], row["chance"], k)
        rows.append(row | {f"p_{j}": float(dist[j]) for j in range(k + 1)})
    depth = depth_index(model)
    used = [
        {
            "layer": layer,
            "visit": visit,
            "depth": depth[layer, visit],
            "expert": ex,
            "share": float(s),
        }
        for layer, visit in model.schedule
        for ex, s in enumerate(usage.mean((layer, visit)))
    ]
    return {"overlap": pd.DataFrame(rows), "usage": pd.DataFrame(used)}


def run(model: LoopedModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    tokens, lengths = inputs.batch()
    return tables(model, tokens, lengths, batch_size=opts.batch_size)


def summarize(result: Tables) -> pd.DataFrame:
    ov = result["overlap"]
    k, e = int(ov["top_k"].iloc[0]), int(ov["n_experts"].iloc[0])
    band = paper.ROUTING_OVERLAP.table_text()
    if k != paper.ROUTING_K:  # the paper's band counts shared experts of 8, not of k
        band = f"{band} (k differs: top-{k} here)"
    return summary(
        [
            (f"routing overlap (of k={k}, E={e})", ov["overlap"].mean(), band),
            (
                "chance from the visits' expert usage, sum_e k^2 u0(e) u1(e)",
                ov["chance"].mean(),
                "",
            ),
            ("chance at even use, k^2/E", k * k / e, ""),
            (
                "chance-normalised overlap, (overlap - chance) / (k - chance)",
                ov["overlap_norm"].mean(),
                "",
            ),
        ]
    )


PROBE = ProbeSpec(
    "routing",
    "Expert-routing overlap between the two visits of each looped layer.",
    run,
    summarize,
    tables=("overlap", "usage"),
    figures=(
        FigureSpec(
            "routing_overlap",
            "overlap",
            "Experts shared by the two visits (dash: chance from the visits' expert usage)",
        ),
        FigureSpec("expert_usage", "usage", "expert usage per visit", per_model=True),
    ),
)


if __name__ == "__main__":  # the entry point: the same as `python -m smelt_interp.probes NAME`
    from smelt_interp.probes.cli import run_probe_command

    run_probe_command(PROBE)
