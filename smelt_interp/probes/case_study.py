"""The case study, for in-context Dyck and associative recall alike, led by the paper's quantity:
per (layer, visit) the attention mass from the answer positions onto BOS and onto the
demonstrations' answers, as the mean over heads with the best head beside it, each beside its
chance level (uniform attention's share of the keys); then the BOS mass at non-answer positions
as a second view, non-answer attention split into BOS, previous token, self and the rest with
its entropy, each looped layer's visit 1 against visit 0 for the same head (and the head
mean), the model's accuracy at the answer positions, and Sink^0.3 on 64-token windows (Gu et
al.'s, per row, and the pooled figure beside it).

Tables (every one with a `task` column): the mass tables of measure.case_tables (`answer`,
`answer_heads`, `visit_pairs`, `visits`, `heads`, `non_answer`, `trend`, `visit_diff`,
`levels`), then `accuracy` (at the answer positions, per demonstration count) and `sink`
(Sink^0.3 on 64-token windows: Gu et al.'s `sink03_gu` and the pooled `sink03_64`).

The position sets come from one per-task definition (measure.case_positions: Dyck prompts, or
held-out rows of the checkpoint's associative-recall spec) and the masses from one computation
(measure.position_mass), the one the trainer's periodic evaluation uses. The five key sets are
disjoint and cover every key: `prev` is the previous token when it is neither BOS nor a
demonstration answer, `self` the query's own key, so bos + demo + prev + self + rest = 1 at every
position; `entropy` is the attention row's entropy in nats. Chance levels are uniform attention
over the keys each query sees (mean over the positions of 1 / (position + 1) for BOS, and of the
set's share of keys for the others), from the actual positions. n_demos is the prompt's
demonstration count (Dyck) or how many earlier occurrences the query's trigger has in its row
(associative recall; 0: first occurrences, MAX_DEMOS: that many or more). Masses are means over
the positions of a group, pooled over rows; every statistic carries a 95% percentile bootstrap
interval over rows/prompts (1,000 resamples with replacement, seeded; columns *_lo/*_hi or
lo/hi); a best head's interval is that head's.

    python -m smelt_interp.probes.case_study ckpt.pt [--task dyck|assoc_recall]
        [--demos 0,1,2,4] [--n-seqs N] [--seq-len T] [--compare OTHER]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from smelt_interp import paper
from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.dyck import DyckExample, dyck_batch
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.measure.batching import DEFAULT_BATCH, inference, make_batch, micro_batches
from smelt_interp.measure.case_positions import check_recall_rows
from smelt_interp.measure.case_tables import case_study, mass_tables
from smelt_interp.measure.dyck_score import answer_scores, complete_many, stop_ids
from smelt_interp.measure.group_masses import (
    MASS_STATS,
    STATS,
    RowMasses,
    by_demos,
    dyck_masses,
    recall_masses,
)
from smelt_interp.measure.intervals import LEVEL, N_RESAMPLES, interval, pooled, resample_weights
from smelt_interp.measure.position_mass import DEFAULT_CHUNK
from smelt_interp.measure.sink import THRESHOLD, WINDOW, row_window_sums, sink_share
from smelt_interp.measure.sink_gu import GU_KEY, GU_NAME, POOLED_NAME
from smelt_interp.model.protocol import LoopedModel
from smelt_interp.probes.common import loop_span
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary

ACCURACY_COLUMNS = ("task", "n_demos", "n", "accuracy", "lo", "hi", "kind")


def rate_row(
    n_demos: int, hits: np.ndarray, counts: np.ndarray, kind: str, seed: int, level: float
) -> dict:
    """One accuracy row: hits / counts pooled over rows, with its bootstrap interval."""
    weights = resample_weights(len(counts), N_RESAMPLES, seed)
    point, boot = pooled(hits[:, None], counts, weights)
    lo, hi = interval(boot, level)
    return {
        "n_demos": n_demos,
        "n": int(counts.sum()),
        "accuracy": float(point[0]),
        "lo": float(lo[0]),
        "hi": float(hi[0]),
        "kind": kind,
    }


def recall_accuracy(masses: RowMasses, *, seed: int = 0, level: float = LEVEL) -> pd.DataFrame:
    """Next-token argmax accuracy at the answer positions per n_demos (0: first occurrences);
    n counts positions."""
    rows = []
    for g in range(masses.counts.shape[1] - 1):
        keep = masses.counts[:, g] > 0
        if keep.any():
            hits, counts = masses.hits[keep, g], masses.counts[keep, g]
            rows.append(rate_row(g, hits, counts, "next_token", seed + g, level))
    return pd.DataFrame(rows, columns=ACCURACY_COLUMNS[1:])


def dyck_accuracy(
    model: LoopedModel,
    examples: Sequence[DyckExample],
    *,
    batch_size: int = DEFAULT_BATCH,
    seed: int = 0,
    level: float = LEVEL,
    tokenizer: Tokenizer | None = None,
) -> pd.DataFrame:
    """Per demonstration count, kind `exact_match` (greedy generation: the answer and nothing
    more) and `teacher_forced` (argmax right at every answer token, then a stop); n counts
    prompts. The examples are in `tokenizer`'s tokens (default bytes)."""
    stops = stop_ids(tokenizer)
    rows = []
    for n_demos, group in by_demos(examples).items():
        tokens, _ = dyck_batch(group)
        batch = make_batch(model, tokens, torch.tensor([len(ex.ids) for ex in group]))
        forced = []
        for mb in micro_batches(batch, batch_size, "case study accuracy"):
            with inference(model):
                logits = model(mb.tokens)
            spans = [ex.answer_span for ex in group[mb.rows]]
            forced += answer_scores(logits, mb.tokens, spans, stops)[1].tolist()
        answers = complete_many(model, group, batch_size=max(batch_size, 32), tokenizer=tokenizer)
        greedy = [a == ex.answer for a, ex in zip(answers, group)]
        ones = np.ones(len(group))
        for kind, hits in (("exact_match", greedy), ("teacher_forced", forced)):
            rows.append(rate_row(n_demos, np.array(hits, float), ones, kind, seed + n_demos, level))
    return pd.DataFrame(rows, columns=ACCURACY_COLUMNS[1:])


def sink_table(
    model: LoopedModel,
    tokens: torch.Tensor,
    valid: torch.Tensor,
    *,
    seed: int = 0,
    level: float = LEVEL,
) -> pd.DataFrame:
    """One row: n_rows; sink03_gu (+_lo/_hi), Sink^0.3 as Gu et al. compute it on the rows'
    first WINDOW tokens (per row, the share of (visit, head)s whose first-key importance exceeds
    0.3, averaged over rows: measure.sink_gu); and sink03_64 (+_lo/_hi), the pooled figure (the
    share of (visit, head)s whose BOS mass over every row's queries 1..WINDOW-1, pooled, exceeds
    0.3); each with its bootstrap interval over rows."""
    sums, counts, per_row = row_window_sums(model, tokens, valid, WINDOW)
    weights = resample_weights(len(counts), N_RESAMPLES, seed)
    point, boot = pooled(sums, counts, weights)
    shares = (boot > THRESHOLD).reshape(len(boot), -1).mean(axis=1)
    lo, hi = interval(shares, level)
    gu_point, gu_boot = pooled(per_row, np.ones(len(per_row)), weights)
    gu_lo, gu_hi = interval(gu_boot, level)
    return pd.DataFrame(
        [
            {
                "n_rows": len(counts),
                GU_KEY: float(gu_point),
                f"{GU_KEY}_lo": float(gu_lo),
                f"{GU_KEY}_hi": float(gu_hi),
                f"sink03_{WINDOW}": sink_share(torch.from_numpy(point)),
                f"sink03_{WINDOW}_lo": float(lo),
                f"sink03_{WINDOW}_hi": float(hi),
            }
        ]
    )


def measure(
    model: LoopedModel,
    examples: Sequence[DyckExample],
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
) -> pd.DataFrame:
    """The Dyck `heads` table of these prompts (no task column): n_demos, layer, visit, depth,
    head, then STATS with their bootstrap intervals over prompts."""
    masses = dyck_masses(model, examples, batch_size=batch_size, chunk=chunk)
    return case_study(masses.groups(), model.schedule)["heads"]


def by_visit(heads: pd.DataFrame) -> pd.DataFrame:
    """Mean over heads per (n_demos, layer, visit) (point values; the `visits` table has
    intervals too)."""
    return (
        heads.groupby(["n_demos", "layer", "visit", "depth"], as_index=False)[list(STATS)]
        .mean()
        .sort_values(["n_demos", "depth"], ignore_index=True)
    )


def with_demos(visits: pd.DataFrame) -> pd.DataFrame:
    """The rows of answer positions with demonstrations (all rows when none has any): where the
    answer can attend to demonstration answers."""
    return visits[visits["n_demos"] > 0] if (visits["n_demos"] > 0).any() else visits


def answer_mass(visits: pd.DataFrame) -> pd.DataFrame:
    """by_visit rows averaged over the groups `with_demos`: one row per (layer, visit), as
    figures.dyck draws them."""
    return (
        with_demos(visits)
        .groupby(["layer", "visit", "depth"], as_index=False)[["bos_mass", "demo_mass"]]
        .mean()
        .sort_values("depth", ignore_index=True)
    )


def _with_task(task: str, df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(task=task)[["task", *df.columns]]


def run(model: LoopedModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    task, seed = inputs.case_task, inputs.seed
    if task == "dyck":
        examples = inputs.dyck_examples()
        masses = dyck_masses(model, examples, batch_size=opts.batch_size, chunk=opts.chunk)
        accuracy = dyck_accuracy(
            model, examples, batch_size=opts.batch_size, seed=seed, tokenizer=inputs.tokenizer
        )
        tokens, lengths = dyck_batch(examples)
        valid = torch.arange(tokens.shape[1])[None, :] < lengths[:, None]
    else:
        tokens = inputs.recall_rows()
        trigger_ids = inputs.assoc_recall.trigger_ids
        check_recall_rows(tokens, trigger_ids, "the case study")
        masses = recall_masses(
            model, tokens, trigger_ids, batch_size=opts.batch_size, chunk=opts.chunk
        )
        accuracy = recall_accuracy(masses, seed=seed)
        valid = tokens != PAD_ID
    out = mass_tables(masses, model.schedule, seed=seed)
    out |= {"accuracy": accuracy, "sink": sink_table(model, tokens, valid, seed=seed)}
    return {name: _with_task(task, out[name]) for name in PROBE.tables}


def summarize(result: Tables) -> pd.DataFrame:
    visits, acc = result["visits"], result["accuracy"]
    demos = with_demos(visits)
    span = loop_span(visits)
    middle = demos[demos["layer"].isin(span)]
    rows = []
    answer = result.get("answer")
    if answer is not None:  # the paper's quantity first: answer positions, head means
        lead = answer[answer["layer"].isin(span)]
        for v, part in lead.groupby("visit"):
            for name, stat, chance in (
                ("bos", "bos_mass", "bos_uniform"),
                ("demo", "demo_mass", "demo_share"),
            ):
                rows.append(
                    (
                        f"{stat.replace('_', ' ')} at answer positions, head mean, loop span, "
                        f"visit {v} (best head {part[f'{name}_best'].mean():.3f}; uniform "
                        f"attention {part[chance].mean():.3f})",
                        part[f"{name}_mean"].mean(),
                        paper.DYCK[stat].at_visit(v),
                    )
                )
    rows += [
        (
            f"{stat.replace('_', ' ')} from answers, loop span, visit {v}",
            part[stat].mean(),
            paper.DYCK[stat].at_visit(v) if stat in paper.DYCK else "",
        )
        for stat in MASS_STATS
        for v, part in middle.groupby("visit")
    ]
    non_answer = result["non_answer"]
    rows += [
        (f"bos mass at non-answer positions, loop span, visit {v}", part["bos_mass"].mean(), "")
        for v, part in non_answer[non_answer["layer"].isin(span)].groupby("visit")
    ]
    rows += [
        (f"{r.kind.replace('_', ' ')} accuracy, {r.n_demos} demos", r.accuracy, "")
        for r in acc.itertuples()
        if r.kind != "teacher_forced"
    ]
    sink = result["sink"].iloc[0]
    rows += [(f"{GU_NAME}, {WINDOW}-token windows", sink[GU_KEY], "")]
    rows += [(f"{POOLED_NAME}, {WINDOW}-token windows", sink[f"sink03_{WINDOW}"], "")]
    rows += [
        (
            f"bos mass slope per effective depth, {r.n_demos} demos "
            f"(95% CI {r.lo:.3f}..{r.hi:.3f})",
            r.slope,
            "",
        )
        for r in result.get("trend", pd.DataFrame()).itertuples()
        if r.statistic == "bos_mass"
    ]
    diffs = result.get("visit_diff", pd.DataFrame())
    rows += [
        (
            f"{r.statistic.replace('_', ' ')} visit 1 - visit 0, layer {r.layer}, {r.n_demos} "
            f"demos (95% CI {r.lo:.3f}..{r.hi:.3f})",
            r.diff,
            "",
        )
        for r in diffs.itertuples()
        if r.n_demos == diffs["n_demos"].max() and r.statistic in ("bos_mass", "demo_mass")
    ]
    return summary(rows)


PROBE = ProbeSpec(
    "case_study",
    "In-context case study (Dyck or associative recall): BOS and demonstration-answer mass at "
    "the answer positions per visit, head mean and best head beside uniform attention's levels; "
    "visit 1 - visit 0 for the same head; then BOS, previous token, self, rest and entropy at "
    "non-answer positions; accuracy; Sink^0.3.",
    run,
    summarize,
    tables=(
        "answer",
        "answer_heads",
        "visit_pairs",
        "visits",
        "heads",
        "non_answer",
        "accuracy",
        "sink",
        "trend",
        "visit_diff",
        "levels",
    ),
    figures=(
        FigureSpec(
            "case_mass",
            "visits",
            "Case study: attention from the answer positions (with demonstrations)",
        ),
        FigureSpec(
            "case_paper", "visits", "Case study: loop-span means per visit, ours and the paper"
        ),
    ),
)


if __name__ == "__main__":  # the entry point: the same as `python -m smelt_interp.probes NAME`
    from smelt_interp.probes.cli import run_probe_command

    run_probe_command(PROBE)
