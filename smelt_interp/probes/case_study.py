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

import pandas as pd

from smelt_interp import paper
from smelt_interp.measure.case_heads import with_demos
from smelt_interp.measure.case_tables import dyck_tables, recall_tables
from smelt_interp.measure.group_masses import MASS_STATS
from smelt_interp.measure.sink import WINDOW
from smelt_interp.measure.sink_gu import GU_KEY, GU_NAME, POOLED_NAME
from smelt_interp.model.protocol import LoopedModel
from smelt_interp.probes.common import loop_span
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary


def run(model: LoopedModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    sizes = {"batch_size": opts.batch_size, "chunk": opts.chunk, "seed": inputs.seed}
    if inputs.case_task == "dyck":
        out = dyck_tables(model, inputs.dyck_examples(), **sizes, tokenizer=inputs.tokenizer)
    else:
        recall = inputs.assoc_recall
        out = recall_tables(model, inputs.recall_rows(), recall.trigger_ids, **sizes)
    return {name: out[name] for name in PROBE.tables}


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
