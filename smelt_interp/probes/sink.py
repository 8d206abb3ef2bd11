"""Sink mass: per (layer, visit, head), the mean over valid query positions i >= 1 of the
attention weight on key 0 (BOS), pooled over all rows' queries; and the share of heads whose
mass exceeds 0.3 (the threshold of "When Attention Sink Emerges").

    python -m smelt_interp.probes.sink ckpt.pt [--data dyck] [--compare OTHER_CKPT] [--csv OUT]
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from smelt_interp.model.transformer import SmeltModel, hook_name
from smelt_interp.probes.attention_stats import DEFAULT_CHUNK, sink_mass_sum
from smelt_interp.probes.common import (
    DEFAULT_BATCH,
    Accumulator,
    capture,
    depth_index,
    loop_span,
    make_batch,
    micro_batches,
    visit_names,
)
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary

THRESHOLD = 0.3


def measure(
    model: SmeltModel,
    tokens: torch.Tensor,
    lengths: torch.Tensor | Sequence[int] | None = None,
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
    threshold: float = THRESHOLD,
) -> pd.DataFrame:
    """Columns: layer, visit, depth, head, sink_mass, is_sink (sink_mass > threshold)."""
    batch = make_batch(model, tokens, lengths)
    names = visit_names(model, model.schedule, "attn.hook_q", "attn.hook_k")
    acc = Accumulator()
    for mb in micro_batches(batch, batch_size, "sink"):
        _, cache = capture(model, mb.tokens, names)
        n_queries = (mb.lengths - 1).sum()
        for layer, visit in model.schedule:
            q, k = (cache[hook_name(layer, visit, f"attn.hook_{x}")] for x in "qk")
            acc.add((layer, visit), sink_mass_sum(q, k, mb.valid, chunk).sum(dim=0), n_queries)
    depth = depth_index(model)
    rows = [
        {
            "layer": layer,
            "visit": visit,
            "depth": depth[layer, visit],
            "head": head,
            "sink_mass": float(m),
        }
        for layer, visit in model.schedule
        for head, m in enumerate(acc.mean((layer, visit)))
    ]
    df = pd.DataFrame(rows)
    df["is_sink"] = df["sink_mass"] > threshold
    return df


def by_visit(heads: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, visit): mean sink mass over heads and the share of sink heads."""
    return (
        heads.groupby(["layer", "visit", "depth"], as_index=False, sort=False)
        .agg(sink_mass=("sink_mass", "mean"), share_sink_heads=("is_sink", "mean"))
        .sort_values("depth", ignore_index=True)
    )


def run(model: SmeltModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    tokens, lengths = inputs.batch()
    heads = measure(model, tokens, lengths, batch_size=opts.batch_size, chunk=opts.chunk)
    return {"heads": heads, "visits": by_visit(heads)}


def summarize(tables: Tables) -> pd.DataFrame:
    heads = tables["heads"]
    span = heads[heads["layer"].isin(loop_span(heads))]
    rows = [
        ("sink mass, all heads", heads["sink_mass"].mean(), ""),
        ("share of heads with mass > threshold", heads["is_sink"].mean(), ""),
    ]
    rows += [
        (f"sink mass, loop span, visit {v}", part["sink_mass"].mean(), "")
        for v, part in span.groupby("visit")
    ]
    rows += [
        (f"share of sink heads, loop span, visit {v}", part["is_sink"].mean(), "")
        for v, part in span.groupby("visit")
    ]
    return summary(rows)


PROBE = ProbeSpec(
    "sink",
    "Attention-sink mass per layer, visit and head.",
    run,
    summarize,
    tables=("heads", "visits"),
    figures=(FigureSpec("sink_by_depth", "visits", "Attention-sink mass by effective depth"),),
    page="/",
)


if __name__ == "__main__":
    from smelt_interp.probes.cli import main

    main(PROBE)
