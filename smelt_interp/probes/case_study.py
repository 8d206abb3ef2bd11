"""The case study, for in-context Dyck and associative recall alike: per (layer, visit, head),
the attention mass from the answer positions onto BOS, onto the demonstrations' answers, onto
the previous token and onto the rest, the BOS mass at non-answer positions, the model's accuracy
at the answer positions, and Sink^0.3 on 64-token windows of the task's rows; the masses' trend
with effective depth and, at each looped layer, visit 1 against visit 0.

The position sets come from one per-task definition (measure.case_positions: Dyck prompts, or
held-out rows of the checkpoint's associative-recall spec) and the masses from one computation
(measure.position_mass), the one the trainer's periodic evaluation uses. The four key sets are
disjoint and cover every key: `prev` is the previous token when it is neither BOS nor a
demonstration answer, so bos + demo + prev + rest = 1 at every answer position. n_demos is the
prompt's demonstration count (Dyck) or how many earlier occurrences the query's trigger has in
its row (associative recall; 0: first occurrences, MAX_DEMOS: that many or more). Masses are
means over the positions of a group, pooled over rows; every statistic carries a 95% percentile
bootstrap interval over rows/prompts (1,000 resamples with replacement, seeded; columns
*_lo/*_hi or lo/hi).

    python -m smelt_interp.probes.case_study ckpt.pt [--task dyck|assoc_recall]
        [--demos 0,1,2,4] [--n-seqs N] [--seq-len T] [--compare OTHER]
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from smelt_interp import paper
from smelt_interp.data.dyck import DyckExample, dyck_batch
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.errors import DataError
from smelt_interp.measure.case_positions import (
    MAX_DEMOS,
    CasePositions,
    check_recall_rows,
    dyck_case,
    recall_case,
)
from smelt_interp.measure.dyck_score import answer_scores, complete_many
from smelt_interp.measure.intervals import LEVEL, N_RESAMPLES, interval, pooled, resample_weights
from smelt_interp.measure.position_mass import (
    DEFAULT_CHUNK,
    group_counts,
    group_sums,
    qk_hook_names,
    visit_masses,
)
from smelt_interp.measure.sink import THRESHOLD, WINDOW, bos_column_sums, sink_share
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes.common import DEFAULT_BATCH, capture, loop_span, make_batch, micro_batches
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary

STATS = ("bos_mass", "demo_mass", "prev_mass", "rest_mass")  # measure.case_positions.KEY_SETS
NON_ANSWER_SEED = 10_000  # the non-answer table's resampling seed offset (beside seed + n_demos)
ACCURACY_COLUMNS = ("task", "n_demos", "n", "accuracy", "lo", "hi", "kind")


@dataclass(frozen=True)
class GroupMasses:
    """The rows (prompts) with answer positions of one demonstration count: per row, the
    attention mass summed over those positions, sums [n, visits (schedule order), heads,
    stats], and how many positions it has, counts [n]."""

    sums: np.ndarray
    counts: np.ndarray


@dataclass(frozen=True)
class RowMasses:
    """Per row of a task's batch and per group (n_demos 0 .. G-2, then the non-answer
    positions): mass sums [n, visits, G, heads, 4 (STATS)], how many queries counted, counts
    [n, G], and at how many the model's argmax is the next token, hits [n, G]."""

    sums: np.ndarray
    counts: np.ndarray
    hits: np.ndarray

    def groups(self) -> dict[int, GroupMasses]:
        """{n_demos: GroupMasses} over the rows that have such answer positions."""
        out = {}
        for g in range(self.counts.shape[1] - 1):
            rows = self.counts[:, g] > 0
            if rows.any():
                out[g] = GroupMasses(self.sums[rows, :, g], self.counts[rows, g])
        return out

    def non_answer(self) -> GroupMasses:
        """BOS mass at the non-answer positions: sums [n, visits, heads, 1]."""
        rows = self.counts[:, -1] > 0
        return GroupMasses(self.sums[rows, :, -1, :, :1], self.counts[rows, -1])


def concat(parts: Sequence[RowMasses]) -> RowMasses:
    """The rows of several RowMasses (same groups) in one."""
    names = [f.name for f in dataclasses.fields(RowMasses)]
    return RowMasses(*(np.concatenate([getattr(p, name) for p in parts]) for name in names))


def row_masses(
    model: SmeltModel,
    tokens: torch.Tensor,
    lengths: torch.Tensor | None,
    positions: CasePositions,
    n_groups: int,
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
) -> RowMasses:
    """Every row's mass sums, counts and next-token hits per group, from one forward pass per
    micro-batch (Q and K cached, the pattern recomputed a chunk of queries at a time)."""
    batch = make_batch(model, tokens, lengths)
    names = qk_hook_names(model.schedule)
    sums, counts, hits = [], [], []
    for mb in micro_batches(batch, batch_size, "case study"):
        logits, cache = capture(model, mb.tokens, names)
        sets = positions.trimmed(mb.rows, mb.tokens.shape[1])
        groups = sets.groups(n_groups).to(mb.tokens.device)
        keys = sets.key_sets().to(mb.tokens.device)
        sums.append(visit_masses(cache, model.schedule, groups, n_groups, keys, chunk))
        counts.append(group_counts(groups, n_groups))
        right = logits.argmax(dim=-1) == sets.targets.to(logits.device)
        hits.append(group_sums(right, groups, n_groups))
    return RowMasses(*(torch.cat(x).cpu().numpy().astype(np.float64) for x in (sums, counts, hits)))


def by_demos(examples: Sequence[DyckExample]) -> dict[int, list[DyckExample]]:
    if not examples:
        raise DataError("the Dyck case study needs at least one example")
    groups: dict[int, list[DyckExample]] = defaultdict(list)
    for ex in examples:
        groups[ex.n_demos].append(ex)
    return dict(sorted(groups.items()))


def dyck_masses(
    model: SmeltModel,
    examples: Sequence[DyckExample],
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
) -> RowMasses:
    """RowMasses of the Dyck prompts, one padded batch per demonstration count."""
    groups = by_demos(examples)
    n_groups = max(groups) + 2
    parts = []
    for group in groups.values():
        tokens, lengths = dyck_batch(group)
        sets = dyck_case(group, tokens, lengths)
        parts.append(
            row_masses(model, tokens, lengths, sets, n_groups, batch_size=batch_size, chunk=chunk)
        )
    return concat(parts)


def recall_masses(
    model: SmeltModel,
    rows: torch.Tensor,
    trigger_ids: tuple[int, ...],
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
) -> RowMasses:
    """RowMasses of associative-recall rows [n, T] (held-out rows, or any hand-made ones)."""
    sets = recall_case(rows, trigger_ids)
    return row_masses(model, rows, None, sets, MAX_DEMOS + 2, batch_size=batch_size, chunk=chunk)


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
    """Columns layer, visit, depth, head, bos_mass (+_lo/_hi): BOS mass at the non-answer
    positions, pooled over rows."""
    m = masses.non_answer()
    heads = case_study({0: m}, schedule, n_resamples=n_resamples, seed=seed + NON_ANSWER_SEED)
    return heads["heads"].drop(columns="n_demos")


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
) -> pd.DataFrame:
    """Per demonstration count, kind `exact_match` (greedy generation: the answer and nothing
    more) and `teacher_forced` (argmax right at every answer token, then a stop); n counts
    prompts."""
    rows = []
    for n_demos, group in by_demos(examples).items():
        tokens, _ = dyck_batch(group)
        batch = make_batch(model, tokens, torch.tensor([len(ex.ids) for ex in group]))
        forced = []
        for mb in micro_batches(batch, batch_size, "case study accuracy"):
            with torch.no_grad():
                logits = model(mb.tokens)
            spans = [ex.answer_span for ex in group[mb.rows]]
            forced += answer_scores(logits, mb.tokens, spans)[1].tolist()
        answers = complete_many(model, group, batch_size=max(batch_size, 32))
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
        accuracy = dyck_accuracy(model, examples, batch_size=opts.batch_size, seed=seed)
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
    tables = case_study(masses.groups(), model.schedule, seed=seed)
    out = {
        "visits": tables["visits"],
        "heads": tables["heads"],
        "non_answer": non_answer_table(masses, model.schedule, seed=seed),
        "accuracy": accuracy,
        "sink": sink_table(model, tokens, valid, seed=seed),
        "trend": tables["trend"],
        "visit_diff": tables["visit_diff"],
    }
    return {name: _with_task(task, df) for name, df in out.items()}


def summarize(result: Tables) -> pd.DataFrame:
    visits, acc = result["visits"], result["accuracy"]
    demos = with_demos(visits)
    span = loop_span(visits)
    middle = demos[demos["layer"].isin(span)]
    rows = [
        (
            f"{stat.replace('_', ' ')} from answers, loop span, visit {v}",
            part[stat].mean(),
            paper.DYCK[stat].at_visit(v) if stat in paper.DYCK else "",
        )
        for stat in STATS
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
    "In-context case study (Dyck or associative recall): attention from answer positions onto "
    "BOS, the demonstration answers, the previous token and the rest, per visit; BOS mass at "
    "non-answer positions; accuracy; Sink^0.3.",
    run,
    summarize,
    tables=("visits", "heads", "non_answer", "accuracy", "sink", "trend", "visit_diff"),
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
