"""The case study's mass tables from a model's RowMasses (measure.group_masses), each statistic
with a 95% percentile bootstrap interval over rows or prompts (1,000 resamples with replacement,
seeded; columns *_lo/*_hi or lo/hi): `answer` (the paper's quantity per layer and visit, pooled
over every answer position with demonstrations: head means and best heads beside uniform
attention's levels, then non-answer BOS), `answer_heads` (the same positions per head),
`visit_pairs` (visit 1 - visit 0 of the looped layers, per head and for the head mean),
`heads`/`visits` (per demonstration count), `non_answer` (BOS, prev, self, rest and entropy at
the non-answer positions), `trend`, `visit_diff` and `levels`. dyck_tables and recall_tables
give every table of the case study from a task's rows: the masses, then `accuracy`
(measure.case_accuracy) and `sink` (Sink^0.3 on 64-token windows, measure.sink).
probes.case_study registers the probe on them; the seeds command reads them per checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.dyck import DyckExample, dyck_batch
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.measure.batching import DEFAULT_BATCH
from smelt_interp.measure.case_accuracy import dyck_accuracy, recall_accuracy
from smelt_interp.measure.case_positions import check_recall_rows
from smelt_interp.measure.group_masses import (
    STATS,
    GroupMasses,
    RowMasses,
    dyck_masses,
    recall_masses,
)
from smelt_interp.measure.intervals import LEVEL, N_RESAMPLES, interval, pooled, resample_weights
from smelt_interp.measure.levels import group_levels
from smelt_interp.measure.position_mass import DEFAULT_CHUNK
from smelt_interp.measure.sink import sink03_table
from smelt_interp.model.protocol import LoopedModel
from smelt_interp.provenance import TASK_RECALL

NON_ANSWER_STATS = tuple(s for s in STATS if s != "demo_mass")  # no demonstrations there
NON_ANSWER_SEED = 10_000  # the non-answer table's resampling seed offset (beside seed + n_demos)
ANSWER_SEED = 20_000  # the pooled answer positions' resampling seed offset
MEAN_HEAD = "mean"  # visit_pairs' head for the mean over heads
Tables = dict[str, pd.DataFrame]  # named tables, as a probe returns them


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
    uniform = m.uniform()
    return heads.assign(**{f"{stat}_uniform": uniform[stat] for stat in NON_ANSWER_STATS})


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
    chance, na_chance = answer.uniform(), non.uniform()
    rows = []
    for i, (layer, visit) in enumerate(schedule):
        row: dict = {"layer": layer, "visit": visit, "depth": i, "n_heads": a.point.shape[1]}
        row |= _head_figures(a, i, BOS, "bos", level) | {"bos_uniform": chance["bos_mass"]}
        row |= _head_figures(a, i, DEMO, "demo", level) | {"demo_share": chance["demo_mass"]}
        row |= _head_figures(na, i, BOS, "na_bos", level)
        row |= {"na_bos_uniform": na_chance["bos_mass"], "n_positions": answer.n_positions}
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
        "levels": group_levels(masses.reference, masses.counts),
    }


def dyck_heads(
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


def dyck_tables(
    model: LoopedModel,
    examples: Sequence[DyckExample],
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
    seed: int = 0,
    tokenizer: Tokenizer | None = None,
) -> Tables:
    """Every case-study table of in-context Dyck prompts (in `tokenizer`'s tokens, default
    bytes), each with_task: mass_tables, `accuracy` (exact match and teacher-forced, per
    demonstration count) and `sink` (Sink^0.3 on the prompts' first 64 tokens)."""
    masses = dyck_masses(model, examples, batch_size=batch_size, chunk=chunk)
    accuracy = dyck_accuracy(model, examples, batch_size=batch_size, seed=seed, tokenizer=tokenizer)
    tokens, lengths = dyck_batch(examples)
    valid = torch.arange(tokens.shape[1])[None, :] < lengths[:, None]
    out = mass_tables(masses, model.schedule, seed=seed)
    out |= {"accuracy": accuracy, "sink": sink03_table(model, tokens, valid, seed=seed)}
    return with_task("dyck", out)


def recall_tables(
    model: LoopedModel,
    tokens: torch.Tensor,
    trigger_ids: Sequence[int],
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
    seed: int = 0,
) -> Tables:
    """Every case-study table of associative-recall rows (PAD after each row's end), each
    with_task: mass_tables,
    `accuracy` (next-token argmax at the answer positions, per earlier-occurrence count) and
    `sink` (Sink^0.3 on the rows' first 64 tokens)."""
    check_recall_rows(tokens, trigger_ids, "the case study")
    masses = recall_masses(model, tokens, trigger_ids, batch_size=batch_size, chunk=chunk)
    out = mass_tables(masses, model.schedule, seed=seed)
    sink = sink03_table(model, tokens, tokens != PAD_ID, seed=seed)
    out |= {"accuracy": recall_accuracy(masses, seed=seed), "sink": sink}
    return with_task(TASK_RECALL, out)


def with_task(task: str, tables: Tables) -> Tables:
    """Each table with a leading `task` column: the case study's tables say which task they
    measure, so two tasks' tables can be stacked."""
    return {name: df.assign(task=task)[["task", *df.columns]] for name, df in tables.items()}
