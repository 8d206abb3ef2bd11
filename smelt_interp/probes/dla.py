"""Direct logit attribution per (layer, visit, head): how much each head's write, and each
visit's MoE write, adds directly to the logit of the correct next token.

A head's write is z_h @ W_O[h] times the visit's residual scale 1/r (as the block adds it, so
the heads of one visit sum to its hook_attn_out); the MoE's is hook_mlp_out. Each write at
position i is read through the final norm with its scale frozen at the one the model applied
there (measure.depth_cache.Readout: the norm's gain in W_U) and dotted with the unembedding of
token i + 1, then averaged over positions whose next token is valid. With the embedding and the
final norm's bias, the parts sum to the model's logit (the `parts` table shows both), so the
per-visit columns say which pass of the loop writes the prediction. `against` measures a logit
difference instead: to a chosen token, or to the mean logit over the vocabulary.

    python -m smelt_interp.probes.dla ckpt.pt [--data dyck] [--compare OTHER] [--csv OUT]
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from smelt_interp.errors import ProbeError
from smelt_interp.measure.batching import (
    DEFAULT_BATCH,
    Accumulator,
    capture,
    make_batch,
    masked_sum,
    micro_batches,
    visit_names,
)
from smelt_interp.measure.depth_cache import check_readout, head_out, readout_of
from smelt_interp.model.protocol import LoopedModel, hook_name
from smelt_interp.probes.common import depth_index, loop_span
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary

PARTS = ("embed", "attn", "mlp", "bias", "total", "logit")


def target_logit(
    logits: torch.Tensor, targets: torch.Tensor, against: int | str | None
) -> torch.Tensor:
    """The model's logit [b, T-1] of each target (minus `against`'s), in float64."""
    logits = logits[:, : targets.shape[1]].double()
    value = logits.gather(-1, targets[..., None])[..., 0]
    if against == "mean":
        return value - logits.mean(-1)
    if against is not None:
        return value - logits[..., int(against)]
    return value


def _check_against(against: int | str | None, vocab: int) -> None:
    if against is None or against == "mean":
        return
    if isinstance(against, str) or not 0 <= int(against) < vocab:
        raise ProbeError(f"against must be None, 'mean' or a token id in 0..{vocab - 1}")


def measure(
    model: LoopedModel,
    tokens: torch.Tensor,
    lengths: torch.Tensor | Sequence[int] | None = None,
    *,
    against: int | str | None = None,
    batch_size: int = DEFAULT_BATCH,
) -> Tables:
    """Tables `heads` (layer, visit, head, depth, dla), `visits` (layer, visit, depth,
    attn_dla, mlp_dla) and `parts` (part: embed, attn, mlp, bias, their total and the model's
    own logit; dla), each a mean over positions whose next token is valid."""
    _check_against(against, model.cfg.vocab_size)
    batch = make_batch(model, tokens, lengths)
    schedule = tuple(model.schedule)
    readout = readout_of(model)
    outs = {(layer, visit): head_out(model, layer, visit) for layer, visit in schedule}
    final = hook_name(*schedule[-1], "hook_resid_post")
    names = ["hook_embed", final, *visit_names(model, schedule, "attn.hook_z", "hook_mlp_out")]
    acc = Accumulator()
    for mb in micro_batches(batch, batch_size, "dla"):
        logits, cache = capture(model, mb.tokens, names)
        check_readout(readout, cache[final], logits)  # a wrong readout: every value wrong
        targets, mask = mb.tokens[:, 1:], mb.valid[:, 1:]
        n = mask.sum()
        u, bias = readout.directions(targets, against)
        # the frozen final-norm scale folded into the direction: one divide per position
        u = u.double() / readout.scale(cache[final][:, :-1].double())

        def project(write: torch.Tensor) -> torch.Tensor:
            return masked_sum((write[:, :-1].double() * u).sum(-1), mask, (0, 1))

        acc.add("embed", project(cache["hook_embed"]), n)
        for layer, visit in schedule:
            out = outs[layer, visit]
            z = cache[hook_name(layer, visit, "attn.hook_z")][:, :-1].double()
            w = torch.einsum("hdm,btm->bthd", out.W_O.double(), u)  # W_O[h] @ u per position
            heads = (z * w).sum(-1) * out.scale
            acc.add((layer, visit, "heads"), masked_sum(heads, mask[..., None], (0, 1)), n)
            attn_bias = 0.0 if out.b_O is None else project(out.b_O.expand_as(cache[final]))
            acc.add((layer, visit, "attn_bias"), torch.as_tensor(attn_bias) * out.scale, n)
            acc.add(
                (layer, visit, "mlp"), project(cache[hook_name(layer, visit, "hook_mlp_out")]), n
            )
        acc.add("bias", masked_sum(bias.double(), mask, (0, 1)), n)
        acc.add("logit", masked_sum(target_logit(logits, targets, against), mask, (0, 1)), n)
    return _tables(acc, schedule, depth_index(model))


def _tables(
    acc: Accumulator, schedule: Sequence[tuple[int, int]], depth: dict[tuple[int, int], int]
) -> Tables:
    heads, visits = [], []
    for layer, visit in schedule:
        key = {"layer": layer, "visit": visit}
        per_head = acc.mean((layer, visit, "heads")).tolist()
        heads += [
            {**key, "head": h, "depth": depth[layer, visit], "dla": v}
            for h, v in enumerate(per_head)
        ]
        attn = sum(per_head) + float(acc.mean((layer, visit, "attn_bias")))
        mlp = float(acc.mean((layer, visit, "mlp")))
        visits.append({**key, "depth": depth[layer, visit], "attn_dla": attn, "mlp_dla": mlp})
    vf = pd.DataFrame(visits)
    parts = {
        "embed": float(acc.mean("embed")),
        "attn": float(vf["attn_dla"].sum()),
        "mlp": float(vf["mlp_dla"].sum()),
        "bias": float(acc.mean("bias")),
    }
    parts["total"] = sum(parts.values())
    parts["logit"] = float(acc.mean("logit"))
    return {
        "heads": pd.DataFrame(heads),
        "visits": vf,
        "parts": pd.DataFrame({"part": list(parts), "dla": list(parts.values())}),
    }


def run(model: LoopedModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    tokens, lengths = inputs.batch()
    return measure(model, tokens, lengths, batch_size=opts.batch_size)


def summarize(result: Tables) -> pd.DataFrame:
    parts = result["parts"].set_index("part")["dla"]
    rows = [
        ("next-token logit (the model's)", parts["logit"], ""),
        ("sum of the direct attributions", parts["total"], ""),
        ("embedding", parts["embed"], ""),
        ("attention, all visits", parts["attn"], ""),
        ("MoE, all visits", parts["mlp"], ""),
    ]
    visits = result["visits"]
    span = visits[visits["layer"].isin(loop_span(visits))]
    for visit, part in span.groupby("visit"):
        rows.append((f"attention, loop span, visit {visit}", part["attn_dla"].sum(), ""))
        rows.append((f"MoE, loop span, visit {visit}", part["mlp_dla"].sum(), ""))
    rows.append(("top head's DLA (which one: the heads table)", result["heads"]["dla"].max(), ""))
    return summary(rows)


PROBE = ProbeSpec(
    "dla",
    "Direct logit attribution to the next token per (layer, visit, head) and per visit's "
    "MoE write, through the final norm's frozen scale.",
    run,
    summarize,
    tables=("heads", "visits", "parts"),
    figures=(
        FigureSpec("by_depth", "visits", "Attention's direct logit attribution", y="attn_dla"),
        FigureSpec("by_depth", "visits", "MoE's direct logit attribution", y="mlp_dla"),
    ),
)


if __name__ == "__main__":  # the entry point: the same as `python -m smelt_interp.probes NAME`
    from smelt_interp.probes.cli import run_probe_command

    run_probe_command(PROBE)
