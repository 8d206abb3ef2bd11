"""The case study, for in-context Dyck and associative recall alike, led by the paper's quantity:
per (layer, visit) the attention mass from the answer positions onto BOS and onto the
demonstrations' answers, as the mean over heads with the best head beside it, each beside its
chance level (uniform attention's share of the keys); then the BOS mass at non-answer positions
as a second view, non-answer attention split into BOS, previous token, self and the rest with
its entropy, each looped layer's visit 1 against visit 0 for the same head (and the head
mean), the model's accuracy at the answer positions, and Sink^0.3 on 64-token windows.

Tables (every one with a `task` column): `answer` (per layer and visit, pooled over every answer
position with demonstrations: head means, best heads, chance levels; then non-answer BOS),
`answer_heads` (the same positions per head, every statistic), `visit_pairs` (visit 1 - visit 0
of the looped layers, per head and for the head mean), `visits`/`heads` (per demonstration
count, head means and per head), `non_answer` (per head: BOS, prev, self, rest and entropy at
the non-answer positions, beside uniform attention's), `accuracy`, `sink`, `trend` and
`visit_diff` (per demonstration count, head means).

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
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from smelt_interp import paper
from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.dyck import DyckExample, dyck_batch
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.measure.case_positions import (
    check_recall_rows,
)
from smelt_interp.measure.dyck_score import answer_scores, complete_many, stop_ids
from smelt_interp.measure.intervals import LEVEL, N_RESAMPLES, interval, pooled, resample_weights
from smelt_interp.measure.position_mass import (
    DEFAULT_CHUNK,
)
from smelt_interp.measure.sink import THRESHOLD, WINDOW, bos_column_sums, sink_share
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes.case_masses import (
    MASS_STATS,
    STATS,
    GroupMasses,
    RowMasses,
    by_demos,
    dyck_masses,
    recall_masses,
)
from smelt_interp.probes.common import (
    DEFAULT_BATCH,
    inference,
    loop_span,
    make_batch,
    micro_batches,
)
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary

NON_ANSWER_STATS = tuple(s for s in STATS if s != "demo_mass")  # no demonstrations there
NON_ANSWER_SEED = 10_000  # the non-answer table's resampling seed offset (beside seed + n_demos)
ANSWER_SEED = 20_000  # the pooled answer positions' resampling seed offset
MEAN_HEAD = "mean"  # visit_pairs' head for the mean over heads
ACCURACY_COLUMNS = ("task", "n_demos", "n", "accuracy", "lo", "hi", "kind")


def case_study(
    masses: dict[int, GroupMasses],
    schedule: Sequence[tuple[int, int]],
    *,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> Tables:
    """The mass tables, each statistic with a percentile bootstrap interval over rows (columns
    *_lo, *_hi): `heads` (n_demos, layer, visit, depth, head, then STATS), `visits` (the same
    averaged over heads), `trend` (per n_demos and statistic, the slope of the head-mean mass
    against effective depth, least squares) and `visit_diff` (per n_demos, looped layer and
    statistic: visit 1 minus visit 0). Groups hold len(STATS) statistics, or fewer (the first)."""
    depth = np.arange(len(schedule), dtype=np.float64)
    centred = (depth - depth.mean()) / max(float(((depth - depth.mean()) ** 2).sum()), 1e-12)
    index = {lv: i for i, lv in enumerate(schedule)}
    looped = sorted({layer for layer, visit in schedule if visit == 1})
    heads, visits, trend, diffs = [], [], [], []
    for n_demos, m in masses.items():
        stats = STATS[: m.sums.shape[-1]]
        weights = resample_weights(len(m.counts), n_resamples, seed + n_demos)
        point, boot = pooled(m.sums, m.counts, weights)  # [P, H, S], [R, P, H, S]
        lo, hi = interval(boot, level)
        v_point, v_boot = point.mean(axis=1), boot.mean(axis=2)  # [P, S], [R, P, S]
        v_lo, v_hi = interval(v_boot, level)
        for i, (layer, visit) in enumerate(schedule):
            key = {"n_demos": n_demos, "layer": layer, "visit": visit, "depth": i}
            for head in range(point.shape[1]):
                heads.append(key | {"head": head} | _cols(stats, point, lo, hi, (i, head)))
            visits.append(key | _cols(stats, v_point, v_lo, v_hi, (i,)))
        for s, stat in enumerate(stats):
            t_lo, t_hi = interval(v_boot[..., s] @ centred, level)
            slope = float(v_point[:, s] @ centred)
            trend.append(
                {"n_demos": n_demos, "statistic": stat, "slope": slope, "lo": t_lo, "hi": t_hi}
            )
            for layer in looped:
                a, b = index[layer, 0], index[layer, 1]
                d_lo, d_hi = interval(v_boot[:, b, s] - v_boot[:, a, s], level)
                diffs.append(
                    {
                        "n_demos": n_demos,
                        "layer": layer,
                        "statistic": stat,
                        "visit_0": v_point[a, s],
                        "visit_1": v_point[b, s],
                        "diff": v_point[b, s] - v_point[a, s],
                        "lo": d_lo,
                        "hi": d_hi,
                    }
                )
    diff_cols = ["n_demos", "layer", "statistic", "visit_0", "visit_1", "diff", "lo", "hi"]
    return {
        "heads": pd.DataFrame(heads),
        "visits": pd.DataFrame(visits),
        "trend": pd.DataFrame(trend, columns=["n_demos", "statistic", "slope", "lo", "hi"]),
        "visit_diff": pd.DataFrame(diffs, columns=diff_cols),
    }


def _cols(
    stats: Sequence[str], point: np.ndarray, lo: np.ndarray, hi: np.ndarray, at: tuple[int, ...]
) -> dict:
    """{stat: value, stat_lo: ..., stat_hi: ...} for every statistic at index `at`."""
    out = {}
    for s, stat in enumerate(stats):
        out |= {stat: point[(*at, s)], f"{stat}_lo": lo[(*at, s)], f"{stat}_hi": hi[(*at, s)]}
    return out


def non_answer_table(
    masses: RowMasses,
    schedule: Sequence[tuple[int, int]],
    *,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> pd.DataFrame:
    """Columns layer, visit, depth, head, then NON_ANSWER_STATS (+_lo/_hi; bos_mass first):
    attention at the non-answer positions, pooled over rows, split into BOS, previous token,
    self and the rest, with its entropy; then each statistic's uniform-attention level
    (`{stat}_uniform`, the same at every visit)."""
    m = masses.non_answer()
    tables = case_study({0: m}, schedule, n_resamples=n_resamples, seed=seed + NON_ANSWER_SEED)
    heads = tables["heads"].drop(columns=["n_demos", "demo_mass", "demo_mass_lo", "demo_mass_hi"])
    uniform = _uniform(m)
    return heads.assign(**{f"{stat}_uniform": uniform[stat] for stat in NON_ANSWER_STATS})


def _uniform(m: GroupMasses) -> dict[str, float]:
    """{stat: uniform attention's level} over the positions of `m`, pooled over rows."""
    assert m.reference is not None
    level = m.reference.sum(axis=0) / m.counts.sum()
    return {stat: float(level[s]) for s, stat in enumerate(STATS)}


@dataclass(frozen=True)
class Pooled:
    """A group's statistics pooled over rows: point [visits, heads, stats], boot [resamples,
    visits, heads, stats], and the percentile interval lo, hi of the point."""

    point: np.ndarray
    boot: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


def pool(m: GroupMasses, n_resamples: int, seed: int, level: float) -> Pooled:
    weights = resample_weights(len(m.counts), n_resamples, seed)
    point, boot = pooled(m.sums, m.counts, weights)
    return Pooled(point, boot, *interval(boot, level))


def _head_figures(p: Pooled, i: int, s: int, name: str, level: float) -> dict:
    """{name_mean (+_lo/_hi), name_best (+_lo/_hi), name_best_head}: statistic `s` at visit `i`
    as the mean over heads (interval of the resampled head means) and for the head with the
    largest value (that head's interval)."""
    mean_lo, mean_hi = interval(p.boot[:, i, :, s].mean(axis=1), level)
    best = int(np.argmax(p.point[i, :, s]))
    return {
        f"{name}_mean": float(p.point[i, :, s].mean()),
        f"{name}_mean_lo": float(mean_lo),
        f"{name}_mean_hi": float(mean_hi),
        f"{name}_best": float(p.point[i, best, s]),
        f"{name}_best_lo": float(p.lo[i, best, s]),
        f"{name}_best_hi": float(p.hi[i, best, s]),
        f"{name}_best_head": best,
    }


BOS, DEMO = STATS.index("bos_mass"), STATS.index("demo_mass")


def answer_table(
    masses: RowMasses,
    schedule: Sequence[tuple[int, int]],
    *,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> pd.DataFrame:
    """The paper's quantity first, per (layer, visit), at every answer position with
    demonstrations (RowMasses.answer) pooled over rows: `bos_*` (BOS mass) and `demo_*` (mass on
    the demonstration answers) as head mean and best head (_head_figures), beside `bos_uniform`
    (uniform attention's BOS share: the mean over the positions of 1 / (position + 1)) and
    `demo_share` (the demonstration answers' share of the keys each position sees); then the
    second view, `na_bos_*`, BOS mass at the non-answer positions, beside `na_bos_uniform`.
    `n_heads` and `n_positions` (answer positions) say what the figures pool."""
    answer, non = masses.answer(), masses.non_answer()
    a = pool(answer, n_resamples, seed + ANSWER_SEED, level)
    na = pool(non, n_resamples, seed + NON_ANSWER_SEED, level)
    chance, na_chance = _uniform(answer), _uniform(non)
    rows = []
    for i, (layer, visit) in enumerate(schedule):
        row: dict = {"layer": layer, "visit": visit, "depth": i, "n_heads": a.point.shape[1]}
        row |= _head_figures(a, i, BOS, "bos", level) | {"bos_uniform": chance["bos_mass"]}
        row |= _head_figures(a, i, DEMO, "demo", level) | {"demo_share": chance["demo_mass"]}
        row |= _head_figures(na, i, BOS, "na_bos", level)
        row |= {"na_bos_uniform": na_chance["bos_mass"], "n_positions": int(answer.counts.sum())}
        rows.append(row)
    return pd.DataFrame(rows)


def answer_heads_table(
    masses: RowMasses,
    schedule: Sequence[tuple[int, int]],
    *,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> pd.DataFrame:
    """Per (layer, visit, head), every statistic (+_lo/_hi) at the positions answer_table
    pools."""
    tables = case_study(
        {0: masses.answer()}, schedule, n_resamples=n_resamples, seed=seed + ANSWER_SEED
    )
    return tables["heads"].drop(columns="n_demos")


def visit_pairs(
    masses: RowMasses,
    schedule: Sequence[tuple[int, int]],
    *,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> pd.DataFrame:
    """Visit 1 - visit 0 of each looped layer for the same head (`head` its index) and for the
    head mean (`head` MEAN_HEAD; the mean pairs like with like whatever the head count), per
    statistic: `bos_mass` and `demo_mass` at the answer positions of answer_table, `na_bos_mass`
    at the non-answer positions; columns layer, head, statistic, visit_0, visit_1, diff, lo, hi
    (the percentile bootstrap of the paired difference over rows)."""
    index = {lv: i for i, lv in enumerate(schedule)}
    looped = sorted({layer for layer, visit in schedule if visit == 1})
    a = pool(masses.answer(), n_resamples, seed + ANSWER_SEED, level)
    na = pool(masses.non_answer(), n_resamples, seed + NON_ANSWER_SEED, level)
    rows = []
    for stat, p, s in (("bos_mass", a, BOS), ("demo_mass", a, DEMO), ("na_bos_mass", na, BOS)):
        heads = [(str(h), p.point[..., h, s], p.boot[..., h, s]) for h in range(p.point.shape[1])]
        heads.append((MEAN_HEAD, p.point[..., s].mean(axis=1), p.boot[..., s].mean(axis=2)))
        for layer in looped:
            first, second = index[layer, 0], index[layer, 1]
            for head, point, boot in heads:
                lo, hi = interval(boot[:, second] - boot[:, first], level)
                rows.append(
                    {"layer": layer, "head": head, "statistic": stat}
                    | {"visit_0": float(point[first]), "visit_1": float(point[second])}
                    | {"diff": float(point[second] - point[first]), "lo": float(lo)}
                    | {"hi": float(hi)}
                )
    columns = ["layer", "head", "statistic", "visit_0", "visit_1", "diff", "lo", "hi"]
    return pd.DataFrame(rows, columns=columns)


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
    model: SmeltModel,
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
    model: SmeltModel,
    tokens: torch.Tensor,
    valid: torch.Tensor,
    *,
    seed: int = 0,
    level: float = LEVEL,
) -> pd.DataFrame:
    """One row: n_rows, sink03_64 (+_lo/_hi), Sink^0.3 on the rows' first WINDOW tokens (the
    share of (visit, head)s whose mean BOS mass over queries 1..WINDOW-1 exceeds 0.3), with its
    bootstrap interval over rows."""
    sums, counts = [], []
    for row in range(tokens.shape[0]):
        s, c = bos_column_sums(model, tokens[row : row + 1, :WINDOW], valid[row : row + 1, :WINDOW])
        sums.append(s.sum(dim=-1).numpy())
        counts.append(float(c.sum()))
    weights = resample_weights(len(counts), N_RESAMPLES, seed)
    point, boot = pooled(np.stack(sums), np.array(counts), weights)
    shares = (boot > THRESHOLD).reshape(len(boot), -1).mean(axis=1)
    lo, hi = interval(shares, level)
    return pd.DataFrame(
        [
            {
                "n_rows": len(counts),
                f"sink03_{WINDOW}": sink_share(torch.from_numpy(point)),
                f"sink03_{WINDOW}_lo": float(lo),
                f"sink03_{WINDOW}_hi": float(hi),
            }
        ]
    )


def measure(
    model: SmeltModel,
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


def run(model: SmeltModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
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


def mass_tables(masses: RowMasses, schedule: Sequence[tuple[int, int]], *, seed: int = 0) -> Tables:
    """Every mass table of the probe (all but `accuracy` and `sink`) from one model's
    RowMasses, without the task column: what the seeds command reads for each checkpoint."""
    tables = case_study(masses.groups(), schedule, seed=seed)
    return {
        "answer": answer_table(masses, schedule, seed=seed),
        "answer_heads": answer_heads_table(masses, schedule, seed=seed),
        "visit_pairs": visit_pairs(masses, schedule, seed=seed),
        "visits": tables["visits"],
        "heads": tables["heads"],
        "non_answer": non_answer_table(masses, schedule, seed=seed),
        "trend": tables["trend"],
        "visit_diff": tables["visit_diff"],
    }


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
    rows += [(f"Sink^0.3 ({WINDOW}-token windows)", result["sink"][f"sink03_{WINDOW}"].iloc[0], "")]
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
