"""The Dyck case study: on in-context Dyck prompts (0..k demonstrations), the attention mass
from the answer positions onto BOS and onto the demonstrations' answer tokens, per (layer,
visit, head) and averaged over heads, plus the model's exact-match accuracy.

Answer positions are the queries that predict the answer's tokens: from the one before its
first token through the one before its last (see data.dyck_eval.answer_positions). Masses are means
over those positions of all examples with the same number of demonstrations.

    python -m smelt_interp.probes.dyck ckpt.pt [--demos 0,1,2,4] [--n-seqs N] [--compare OTHER]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import pandas as pd
import torch

from smelt_interp import paper
from smelt_interp.data.dyck import DyckExample, dyck_batch
from smelt_interp.data.dyck_eval import answer_positions, answer_scores, exact_match_accuracy
from smelt_interp.errors import DataError
from smelt_interp.model.transformer import SmeltModel, hook_name
from smelt_interp.probes.attention_stats import DEFAULT_CHUNK, key_set_mass
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
from smelt_interp.probes.metrics import span_mask
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary


def _by_demos(examples: Sequence[DyckExample]) -> dict[int, list[DyckExample]]:
    if not examples:
        raise DataError("the Dyck probe needs at least one example")
    groups: dict[int, list[DyckExample]] = defaultdict(list)
    for ex in examples:
        groups[ex.n_demos].append(ex)
    return dict(sorted(groups.items()))


def measure(
    model: SmeltModel,
    examples: Sequence[DyckExample],
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
) -> pd.DataFrame:
    """Columns: n_demos, layer, visit, depth, head, bos_mass, demo_mass (0 without demos)."""
    names = visit_names(model, model.schedule, "attn.hook_q", "attn.hook_k")
    depth = depth_index(model)
    rows = []
    for n_demos, group in _by_demos(examples).items():
        batch = make_batch(model, *dyck_batch(group))
        device, width = batch.tokens.device, batch.tokens.shape[1]
        q_pos, q_valid = answer_positions([ex.answer_span for ex in group], device)
        key_sets = torch.stack(
            [
                span_mask([[(0, 1)]] * len(group), width, device),
                span_mask([ex.demo_answer_spans for ex in group], width, device),
            ],
            dim=1,
        )
        acc = Accumulator()
        for mb in micro_batches(batch, batch_size, f"dyck ({n_demos} demos)"):
            _, cache = capture(model, mb.tokens, names)
            pos, keep = q_pos[mb.rows], q_valid[mb.rows]
            sets = key_sets[mb.rows, :, : mb.tokens.shape[1]]
            for layer, visit in model.schedule:
                q, k = (cache[hook_name(layer, visit, f"attn.hook_{x}")] for x in "qk")
                acc.add(
                    (layer, visit),
                    key_set_mass(q, k, pos, keep, sets, chunk).sum(dim=0),
                    keep.sum(),
                )
        for layer, visit in model.schedule:
            for head, (bos, demo) in enumerate(acc.mean((layer, visit)).tolist()):
                rows.append(
                    {
                        "n_demos": n_demos,
                        "layer": layer,
                        "visit": visit,
                        "depth": depth[layer, visit],
                        "head": head,
                        "bos_mass": bos,
                        "demo_mass": demo,
                    }
                )
    return pd.DataFrame(rows)


def by_visit(heads: pd.DataFrame) -> pd.DataFrame:
    """Mean over heads per (n_demos, layer, visit)."""
    return (
        heads.groupby(["n_demos", "layer", "visit", "depth"], as_index=False)
        .agg(bos_mass=("bos_mass", "mean"), demo_mass=("demo_mass", "mean"))
        .sort_values(["n_demos", "depth"], ignore_index=True)
    )


def with_demos(visits: pd.DataFrame) -> pd.DataFrame:
    """The rows of prompts with demonstrations (all rows when no prompt has any): where the
    answer can attend to demonstration answers."""
    return visits[visits["n_demos"] > 0] if (visits["n_demos"] > 0).any() else visits


def answer_mass(visits: pd.DataFrame) -> pd.DataFrame:
    """by_visit rows averaged over the prompts `with_demos`: one row per (layer, visit), as
    figures.dyck draws them."""
    return (
        with_demos(visits)
        .groupby(["layer", "visit", "depth"], as_index=False)[["bos_mass", "demo_mass"]]
        .mean()
        .sort_values("depth", ignore_index=True)
    )


def accuracy(
    model: SmeltModel, examples: Sequence[DyckExample], *, batch_size: int = DEFAULT_BATCH
) -> pd.DataFrame:
    """Per demonstration count: n_examples, exact_match (greedy generation, the answer and
    nothing more) and teacher_forced (argmax right at every answer token)."""
    rows = []
    for n_demos, group in _by_demos(examples).items():
        batch = make_batch(model, *dyck_batch(group))
        forced = 0
        for mb in micro_batches(batch, batch_size, "dyck accuracy"):
            with torch.no_grad():
                logits = model(mb.tokens)
            forced += int(
                answer_scores(logits, mb.tokens, [ex.answer_span for ex in group[mb.rows]])[1].sum()
            )
        rows.append(
            {
                "n_demos": n_demos,
                "n_examples": len(group),
                "exact_match": exact_match_accuracy(model, group, batch_size=max(batch_size, 32)),
                "teacher_forced": forced / len(group),
            }
        )
    return pd.DataFrame(rows)


def run(model: SmeltModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    examples = inputs.dyck_examples()
    heads = measure(model, examples, batch_size=opts.batch_size, chunk=opts.chunk)
    return {
        "visits": by_visit(heads),
        "heads": heads,
        "accuracy": accuracy(model, examples, batch_size=opts.batch_size),
    }


def summarize(result: Tables) -> pd.DataFrame:
    visits, acc = result["visits"], result["accuracy"]
    demos = with_demos(visits)
    middle = demos[demos["layer"].isin(loop_span(visits))]
    rows = [
        (
            f"{stat.replace('_', ' ')} from answers, loop span, visit {v}",
            part[stat].mean(),
            paper.DYCK[stat].at_visit(v),
        )
        for stat in ("bos_mass", "demo_mass")
        for v, part in middle.groupby("visit")
    ]
    rows += [(f"exact match, {n} demos", a, "") for n, a in zip(acc["n_demos"], acc["exact_match"])]
    return summary(rows)


PROBE = ProbeSpec(
    "dyck",
    "Dyck in-context case study: attention from answer positions onto BOS and "
    "onto demonstration answers, per visit; exact-match accuracy.",
    run,
    summarize,
    tables=("visits", "heads", "accuracy"),
    figures=(
        FigureSpec(
            "dyck_mass",
            "visits",
            "Dyck: attention from the answer positions (prompts with demonstrations)",
        ),
        FigureSpec("dyck_paper", "visits", "Dyck: loop-span means per visit, ours and the paper"),
    ),
    page="/dyck",
)


if __name__ == "__main__":
    from smelt_interp.probes.cli import main

    main(PROBE)
