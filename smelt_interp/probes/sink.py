"""Sink mass: per (layer, visit, head), the mean over valid query positions i >= 1 of the
attention weight on key 0 (BOS), pooled over all rows' queries; the share of heads whose mass
exceeds 0.3 (the threshold of "When Attention Sink Emerges"), at the full length and on 64-token
windows (the pooled Sink^0.3); Sink^0.3 as Gu et al. compute it, per sample with query 0 kept
(smelt_interp.measure.sink_gu, shared with the trainer); the
uniform-attention level for both lengths (the mass a head spreading evenly would put on BOS:
the mean over valid queries i >= 1 of 1 / (i + 1)); and per head the BOS value-norm ratio
(the norm of v at BOS over the mean norm of v at the other valid positions, for the kv head the
query head reads): a dormant head that parks on BOS usually has a small BOS value. A model with
a learned sink slot (an adapted inkling2_loop) has `sink_slot_mass` beside: the mass its sink
logit takes, the same mechanism held by a parameter. For a model whose tokenizer adds no BOS the
first position of each row stands in for it.

    python -m smelt_interp.probes.sink ckpt.pt [--data dyck] [--compare OTHER_CKPT] [--csv OUT]
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from smelt_interp.measure.attention_stats import DEFAULT_CHUNK
from smelt_interp.measure.batching import DEFAULT_BATCH
from smelt_interp.measure.head_masses import W, sink_masses
from smelt_interp.measure.sink import THRESHOLD, WINDOW
from smelt_interp.measure.sink_gu import GU_KEY, GU_NAME, POOLED_NAME
from smelt_interp.model.protocol import LoopedModel
from smelt_interp.probes.common import loop_span
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary


def measure(
    model: LoopedModel,
    tokens: torch.Tensor,
    lengths: torch.Tensor | Sequence[int] | None = None,
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
    threshold: float = THRESHOLD,
) -> pd.DataFrame:
    """Columns: layer, visit, depth, head, sink_mass, is_sink (sink_mass > threshold),
    sink_mass_64, is_sink_64 (queries 1..63 pooled over rows: the pooled Sink^0.3's heads),
    first_key_importance_64 (Gu et al.'s importance of key 0, query 0 kept, mean over rows),
    sink03_gu (the share of rows in which that importance exceeds threshold: Gu et al.'s
    per-sample indicator, averaged over rows), v_norm_ratio, uniform_mass, uniform_mass_64,
    and sink_slot_mass for a model with learned sinks, key0 for a model with no BOS (what key
    0 is): measure.head_masses.sink_masses read as a table."""
    masses = sink_masses(
        model, tokens, lengths, batch_size=batch_size, chunk=chunk, threshold=threshold
    )
    df = masses.frame()
    df["is_sink"] = df["sink_mass"] > threshold
    df[f"is_sink{W}"] = df[f"sink_mass{W}"] > threshold
    if model.cfg.first_token_id is None:  # say so: key 0 is the row's own first token
        df["key0"] = "first token (the model adds no BOS)"
    df["uniform_mass"] = masses.uniform["sink_mass"]
    df[f"uniform_mass{W}"] = masses.uniform[f"sink_mass{W}"]
    return df


def by_visit(heads: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, visit): mean sink mass over heads and the share of sink heads, both at the
    full length and on 64-token windows (pooled over rows), sink03_gu (per sample, the share of
    heads whose first-key importance exceeds the threshold, averaged over samples: Gu et al.'s
    Sink^0.3 of this visit), the mean value-norm ratio and the uniform levels."""
    agg = {
        "sink_mass": ("sink_mass", "mean"),
        "share_sink_heads": ("is_sink", "mean"),
        f"sink_mass{W}": (f"sink_mass{W}", "mean"),
        f"share_sink_heads{W}": (f"is_sink{W}", "mean"),
        GU_KEY: (GU_KEY, "mean"),
        "v_norm_ratio": ("v_norm_ratio", "mean"),
        "sink_slot_mass": ("sink_slot_mass", "mean"),
        "uniform_mass": ("uniform_mass", "first"),
        f"uniform_mass{W}": (f"uniform_mass{W}", "first"),
    }
    return (
        heads.groupby(["layer", "visit", "depth"], as_index=False, sort=False)
        .agg(**{k: v for k, v in agg.items() if v[0] in heads})
        .sort_values("depth", ignore_index=True)
    )


def run(model: LoopedModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    tokens, lengths = inputs.batch()
    heads = measure(model, tokens, lengths, batch_size=opts.batch_size, chunk=opts.chunk)
    return {"heads": heads, "visits": by_visit(heads)}


def summarize(tables: Tables) -> pd.DataFrame:
    heads = tables["heads"]
    span = heads[heads["layer"].isin(loop_span(heads))]
    on = f" (on the {heads['key0'].iloc[0]})" if "key0" in heads else ""
    rows = [
        (f"sink mass{on}, all heads", heads["sink_mass"].mean(), ""),
        ("uniform-attention level at this length", heads["uniform_mass"].iloc[0], ""),
        ("share of heads with mass > threshold", heads["is_sink"].mean(), ""),
        (GU_NAME, heads[GU_KEY].mean(), ""),
        (POOLED_NAME, heads[f"is_sink{W}"].mean(), ""),
        (f"uniform-attention level, {WINDOW}-token windows", heads[f"uniform_mass{W}"].iloc[0], ""),
        ("BOS value-norm ratio, median over heads", heads["v_norm_ratio"].median(), ""),
    ]
    if "sink_slot_mass" in heads:
        rows.append(("learned-sink slot mass, all heads", heads["sink_slot_mass"].mean(), ""))
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
    "Attention-sink mass per layer, visit and head; Sink^0.3 (Gu et al., per sample, "
    "64-token windows) and the pooled figure; "
    "BOS value-norm ratio.",
    run,
    summarize,
    tables=("heads", "visits"),
    figures=(
        FigureSpec("sink_by_depth", "visits", "Attention-sink mass by effective depth"),
        FigureSpec(
            "by_depth",
            "visits",
            f"{GU_NAME}: share of heads over 0.3 per sample, by effective depth",
            y=GU_KEY,
        ),
    ),
)


if __name__ == "__main__":  # the entry point: the same as `python -m smelt_interp.probes NAME`
    from smelt_interp.probes.cli import run_probe_command

    run_probe_command(PROBE)
