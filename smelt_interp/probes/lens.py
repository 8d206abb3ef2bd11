"""Logit lens by effective depth: the residual after every (layer, visit), in execution order,
through the final norm and unembedding. At each depth: next-token cross-entropy over valid
positions and, on Dyck prompts, teacher-forced answer accuracy, so one sees what the second
visit adds and whether a loop boundary (the end of a pass over the span) is a good early exit.
The last depth is the model's own output. A BPE model is given the Dyck prompts in its own tokens
(data.dyck_tokens) and scored there (measure.dyck_score.stop_ids).

    python -m smelt_interp.probes.lens ckpt.pt [--data dyck] [--demos 0,1,2,4] [--compare OTHER]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch

from smelt_interp.data.dyck import dyck_batch
from smelt_interp.data.dyck_tokens import can_pose_dyck
from smelt_interp.measure.batching import (
    DEFAULT_BATCH,
    Accumulator,
    capture,
    inference,
    make_batch,
    micro_batches,
    visit_names,
)
from smelt_interp.measure.dyck_score import STOP_IDS, Span, answer_scores, stop_ids
from smelt_interp.model.protocol import LoopedModel, hook_name
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.metrics import ce_totals
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary

NAN = math.nan


def lens_logits(model: LoopedModel, resid: torch.Tensor) -> torch.Tensor:
    """Logits read off a residual stream [.., d_model] as if it were the last layer's."""
    return model.unembed_resid(resid)


def measure(
    model: LoopedModel,
    tokens: torch.Tensor,
    lengths: torch.Tensor | Sequence[int] | None = None,
    *,
    answer_spans: Sequence[Span] | None = None,
    batch_size: int = DEFAULT_BATCH,
    stops: Sequence[int] = STOP_IDS,
) -> pd.DataFrame:
    """Columns: depth, layer, visit, loop_boundary (end of a pass over the looped span), ce;
    with `answer_spans` (one [start, end) per row) also answer_token_acc and answer_exact (an
    answer ends in one of `stops`, the model's stop_ids)."""
    batch = make_batch(model, tokens, lengths)
    names = visit_names(model, model.schedule, "hook_resid_post")
    acc = Accumulator()
    for mb in micro_batches(batch, batch_size, "lens"):
        _, cache = capture(model, mb.tokens, names)
        spans = None if answer_spans is None else list(answer_spans)[mb.rows]
        for depth, (layer, visit) in enumerate(model.schedule):
            with inference(model):
                logits = lens_logits(model, cache[hook_name(layer, visit, "hook_resid_post")])
            acc.add((depth, "ce"), *ce_totals(logits, mb.tokens, mb.valid))
            if spans is not None:
                right, exact = answer_scores(logits, mb.tokens, spans, stops)
                n_answer = sum(end - start for start, end in spans)
                acc.add((depth, "token"), right.sum(), n_answer)
                acc.add((depth, "exact"), exact.sum(), len(spans))
    cfg = model.cfg
    rows = []
    for depth, (layer, visit) in enumerate(model.schedule):
        row = {
            "depth": depth,
            "layer": layer,
            "visit": visit,
            "loop_boundary": bool(cfg.looped_layers) and layer == cfg.looped_layers[-1],
            "ce": float(acc.mean((depth, "ce"))),
        }
        if answer_spans is not None:
            row |= {
                "answer_token_acc": float(acc.mean((depth, "token"))),
                "answer_exact": float(acc.mean((depth, "exact"))),
            }
        rows.append(row)
    return pd.DataFrame(rows)


def run(model: LoopedModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    tokens, lengths = inputs.batch()
    depths = measure(model, tokens, lengths, batch_size=opts.batch_size)
    if not can_pose_dyck(inputs.tokenizer):  # ids only: the rows' CE, no Dyck columns
        return {"depths": depths.assign(dyck_ce=NAN, dyck_token_acc=NAN, dyck_exact=NAN)}
    examples = inputs.dyck_examples()
    dyck = measure(
        model,
        *dyck_batch(examples),
        answer_spans=[ex.answer_span for ex in examples],
        batch_size=opts.batch_size,
        stops=stop_ids(inputs.tokenizer),
    )
    dyck = dyck.rename(
        columns={
            "ce": "dyck_ce",
            "answer_token_acc": "dyck_token_acc",
            "answer_exact": "dyck_exact",
        }
    )
    return {"depths": depths.merge(dyck, on=["depth", "layer", "visit", "loop_boundary"])}


def summarize(result: Tables) -> pd.DataFrame:
    df = result["depths"]
    final = df.iloc[-1]
    rows = [
        ("CE at the output", final["ce"], ""),
        ("Dyck exact (teacher-forced) at the output", final["dyck_exact"], ""),
    ]
    for _, row in df[df["loop_boundary"]].iterrows():
        rows.append(
            (f"CE after pass {row['visit']} of the loop (depth {row['depth']})", row["ce"], "")
        )
        rows.append((f"Dyck exact after pass {row['visit']} of the loop", row["dyck_exact"], ""))
    return summary(rows)


PROBE = ProbeSpec(
    "lens",
    "Logit lens at every (layer, visit): cross-entropy and Dyck answer "
    "accuracy by effective depth.",
    run,
    summarize,
    tables=("depths",),
    figures=(FigureSpec("lens_ce", "depths", "Logit lens by effective depth"),),
)


if __name__ == "__main__":  # the entry point: the same as `python -m smelt_interp.probes NAME`
    from smelt_interp.probes.cli import run_probe_command

    run_probe_command(PROBE)
