"""Residual writes per visit: the L2 norm of what attention (hook_attn_out) and the MoE
(hook_mlp_out) add to the residual stream, after the 1/r loop scaling, absolute and relative
to the norm of the residual they are added to (hook_resid_pre and hook_resid_mid); each a mean
over valid tokens (the relative one is the mean of per-token ratios).

    python -m smelt_interp.probes.residual ckpt.pt [--data dyck] [--compare OTHER] [--csv OUT]
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from smelt_interp.measure.batching import (
    DEFAULT_BATCH,
    Accumulator,
    capture,
    make_batch,
    micro_batches,
    visit_names,
)
from smelt_interp.model.protocol import LoopedModel, hook_name
from smelt_interp.probes.common import depth_index, loop_span
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary

SUBLAYERS = {"attn": ("hook_attn_out", "hook_resid_pre"), "mlp": ("hook_mlp_out", "hook_resid_mid")}


def measure(
    model: LoopedModel,
    tokens: torch.Tensor,
    lengths: torch.Tensor | Sequence[int] | None = None,
    *,
    batch_size: int = DEFAULT_BATCH,
) -> pd.DataFrame:
    """Columns: layer, visit, depth, sublayer (attn|mlp), write_norm, resid_norm, relative."""
    batch = make_batch(model, tokens, lengths)
    names = visit_names(model, model.schedule, *(h for pair in SUBLAYERS.values() for h in pair))
    acc = Accumulator()
    for mb in micro_batches(batch, batch_size, "residual"):
        _, cache = capture(model, mb.tokens, names)
        n_tokens = mb.valid.sum()
        for layer, visit in model.schedule:
            for sub, (write_hook, resid_hook) in SUBLAYERS.items():
                write = cache[hook_name(layer, visit, write_hook)].double().norm(dim=-1)[mb.valid]
                resid = cache[hook_name(layer, visit, resid_hook)].double().norm(dim=-1)[mb.valid]
                stats = torch.stack([write.sum(), resid.sum(), (write / resid).sum()])
                acc.add((layer, visit, sub), stats, n_tokens)
    depth = depth_index(model)
    rows = []
    for layer, visit in model.schedule:
        for sub in SUBLAYERS:
            write, resid, rel = acc.mean((layer, visit, sub)).tolist()
            rows.append(
                {
                    "layer": layer,
                    "visit": visit,
                    "depth": depth[layer, visit],
                    "sublayer": sub,
                    "write_norm": write,
                    "resid_norm": resid,
                    "relative": rel,
                }
            )
    return pd.DataFrame(rows)


def run(model: LoopedModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    tokens, lengths = inputs.batch()
    return {"writes": measure(model, tokens, lengths, batch_size=opts.batch_size)}


def summarize(result: Tables) -> pd.DataFrame:
    df = result["writes"]
    span = df[df["layer"].isin(loop_span(df))]
    rows = []
    for (sub, visit), part in span.groupby(["sublayer", "visit"]):
        rows.append(
            (f"{sub} write / residual, loop span, visit {visit}", part["relative"].mean(), "")
        )
    for sub, part in df.groupby("sublayer"):
        rows.append((f"{sub} write / residual, all layers", part["relative"].mean(), ""))
    return summary(rows)


PROBE = ProbeSpec(
    "residual",
    "Norms of the attention and MoE writes per visit, absolute and "
    "relative to the residual stream.",
    run,
    summarize,
    tables=("writes",),
    figures=(FigureSpec("residual_writes", "writes", "Residual writes by effective depth"),),
)


if __name__ == "__main__":  # the entry point: the same as `python -m smelt_interp.probes NAME`
    from smelt_interp.probes.cli import run_probe_command

    run_probe_command(PROBE)
