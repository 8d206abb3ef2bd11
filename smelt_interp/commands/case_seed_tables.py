"""The seeds command's case-study tables, for both tasks (recall rows, Dyck words): from each
checkpoint's `case_study` probe tables (measure.case_tables.mass_tables), per seed, then over
seeds with measure.seeds.over_seeds, and their Markdown.

Led by the paper's quantity: per (layer, visit), BOS mass and demonstration-answer mass at the
answer positions as the mean over heads and for the best head, beside uniform attention's
levels (the BOS share 1 / (position + 1) and the demonstration answers' share of the keys, each
averaged over the actual answer positions). Then visit 1 - visit 0 of each looped layer for the
head mean and for one head followed across its two visits (the head with the most mass at visit
0 on selection rows disjoint from the rows reported, so both visits are the same head of the same
weights and the choice does not ride on the reported rows' noise); then, as the second view,
attention at the non-answer positions: BOS, previous token, self, the rest and the entropy, head
means beside uniform attention's. When the models of a pair have different head counts the
tables say so: their best heads are maxima over different numbers of heads, and the head means
compare like with like.

Over seeds a mass cell reads `mean; median; lowest to highest; seeds > 0.3 / > 0.5`, with no
interval (over 3-5 seeds a percentile bootstrap covers far less than its nominal 95%,
measure.seed_stats); paired differences list every seed with exact tests
(commands.seed_comparisons), and the paper's comparison is SMELT's visit change against the
Baseline's change at the same effective depths."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from smelt_interp.commands.seed_comparisons import did_part, pair_tests
from smelt_interp.measure.case_tables import MEAN_HEAD
from smelt_interp.measure.seeds import THRESHOLDS, over_seeds, threshold_column
from smelt_interp.results import markdown_table, table_block

SUFFIXES = ("", "_lo", "_hi")
# per (layer, visit): answer positions (the paper's quantity), then non-answer BOS
ANSWER_STATS = ("bos_mean", "bos_best", "demo_mean", "demo_best")
VISIT_STATS = (*ANSWER_STATS, "na_bos_mean", "na_bos_best")
REFERENCES = ("bos_uniform", "demo_share", "na_bos_uniform")
BEST_HEADS = ("bos_best_head", "demo_best_head", "na_bos_best_head")
# per looped layer: visit 1 - visit 0, head mean and the same head at both visits
PAIRS = (("bos", "bos_mass"), ("demo", "demo_mass"), ("na_bos", "na_bos_mass"))
PAIR_STATS = tuple(f"{name}_{kind}" for name, _ in PAIRS for kind in ("mean", "same"))
PAIR_COLS = ("diff", "lo", "hi")  # visit_pairs' columns for "", _lo, _hi
PAIR_NAMES = {
    f"{name}_{kind}": f"{label}, {'head mean' if kind == 'mean' else 'same head'}"
    for name, label in (("bos", "BOS"), ("demo", "demo"), ("na_bos", "non-answer BOS"))
    for kind in ("mean", "same")
}
# per (layer, visit), head means at the non-answer positions
SPLIT_STATS = ("bos_mass", "prev_mass", "self_mass", "rest_mass", "entropy")
SPLIT_UNIFORM = tuple(f"{s}_uniform" for s in SPLIT_STATS)
# per (layer, visit) on the control rows
CONTROL_STATS = ("demo_mean", "demo_best", "bos_mean", "bos_best")
CONTROL_REFERENCES = ("demo_share", "bos_uniform")
DASH = "–"


def visit_figures(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Per (layer, visit) of one checkpoint: the probe's `answer` table's figures (with their
    bootstrap intervals over rows), best heads, chance levels and head count."""
    cols = [f"{c}{s}" for c in VISIT_STATS for s in SUFFIXES]
    keep = ["layer", "visit", "n_heads", *cols, *BEST_HEADS, *REFERENCES]
    return tables["answer"][keep].reset_index(drop=True)


def choose_heads(selection: Mapping[str, pd.DataFrame]) -> dict[tuple[int, str], int]:
    """{(layer, statistic): head} of the tracked heads, from the probe's `visit_pairs` on
    SELECTION rows, disjoint from the rows reported: per looped layer and statistic, the head
    with the most mass at visit 0 there. Choosing on the reported rows would bias visit 1 -
    visit 0 downwards (regression to the mean: the head that looks best at visit 0 on those
    rows is partly the one whose noise was high there)."""
    pairs = selection["visit_pairs"]
    heads = pairs[pairs["head"] != MEAN_HEAD]
    return {
        (int(layer), stat): int(part.loc[part["visit_0"].idxmax(), "head"])
        for (layer, stat), part in heads.groupby(["layer", "statistic"], sort=True)
    }


def pair_figures(
    tables: Mapping[str, pd.DataFrame], chosen: Mapping[tuple[int, str], int]
) -> pd.DataFrame:
    """Per looped layer of one checkpoint, from the probe's `visit_pairs`: `{name}_mean` (+_lo/
    _hi), visit 1 - visit 0 of the head mean, and `{name}_same` (+_lo/_hi, `_same_head`), the
    same difference for the head `chosen` (choose_heads, on rows apart from these), followed
    from visit 0 to visit 1."""
    pairs = tables["visit_pairs"]
    rows = []
    for layer, part in pairs.groupby("layer", sort=True):
        row: dict[str, Any] = {"layer": int(layer)}
        for name, stat in PAIRS:
            of = part[part["statistic"] == stat]
            mean = of[of["head"] == MEAN_HEAD].iloc[0]
            heads = of[of["head"] != MEAN_HEAD]
            same = heads[heads["head"].astype(int) == chosen[int(layer), stat]].iloc[0]
            for kind, r in (("mean", mean), ("same", same)):
                row |= {f"{name}_{kind}{s}": float(r[c]) for s, c in zip(SUFFIXES, PAIR_COLS)}
            row[f"{name}_same_head"] = int(same["head"])
        rows.append(row)
    cols = [f"{c}{s}" for c in PAIR_STATS for s in SUFFIXES]
    return pd.DataFrame(rows, columns=["layer", *cols, *(f"{n}_same_head" for n, _ in PAIRS)])


def split_figures(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Per (layer, visit) of one checkpoint: the non-answer positions' BOS, previous token,
    self and rest mass and entropy as means over heads, beside uniform attention's."""
    non = tables["non_answer"]
    return (
        non.groupby(["layer", "visit"], sort=False)[[*SPLIT_STATS, *SPLIT_UNIFORM]]
        .mean()
        .reset_index()
    )


def control_figures(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Per (layer, visit) of one checkpoint on the control rows (answers not predictable from
    the demonstrations): the answer positions' demonstration and BOS mass beside chance."""
    cols = [f"{c}{s}" for c in CONTROL_STATS for s in SUFFIXES]
    return tables["answer"][["layer", "visit", *cols, *CONTROL_REFERENCES]].reset_index(drop=True)


def checkpoint_figures(
    tables: Mapping[str, pd.DataFrame],
    selection: Mapping[str, pd.DataFrame],
    control: Mapping[str, pd.DataFrame] | None = None,
) -> dict[str, pd.DataFrame]:
    """Every per-seed frame of one checkpoint: `visits`, `pairs` (the tracked heads chosen on
    the `selection` rows' tables, choose_heads), `split` and, with the control rows' tables,
    `control`."""
    out = {
        "visits": visit_figures(tables),
        "pairs": pair_figures(tables, choose_heads(selection)),
        "split": split_figures(tables),
    }
    if control is not None:
        out["control"] = control_figures(control)
    return out


KEYS = {
    "visits": ["model", "layer", "visit"],
    "pairs": ["model", "layer"],
    "split": ["model", "layer", "visit"],
    "control": ["model", "layer", "visit"],
}
STATS = {
    "visits": (*VISIT_STATS, *REFERENCES, "n_heads"),
    "pairs": PAIR_STATS,
    "split": (*SPLIT_STATS, *SPLIT_UNIFORM),
    "control": (*CONTROL_STATS, *CONTROL_REFERENCES),
}


def summarize(per_seed: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Each per-seed frame (one row per seed and KEYS) over seeds (measure.seeds.over_seeds)."""
    return {
        name: over_seeds(frame, KEYS[name], STATS[name])
        for name, frame in per_seed.items()
        if len(frame)
    }


def head_counts(visits: pd.DataFrame) -> dict[str, int]:
    """{model: heads a layer} of a per-seed visits frame."""
    return {m: int(part["n_heads"].iloc[0]) for m, part in visits.groupby("model", sort=False)}


def head_count_note(visits: pd.DataFrame) -> str:
    """A sentence on the models' head counts: a warning when they differ."""
    counts = head_counts(visits)
    listed = ", ".join(f"{m} {n} head{'s' if n != 1 else ''} a layer" for m, n in counts.items())
    if len(set(counts.values())) <= 1:
        return f"Heads: {listed}."
    return (
        f"Head counts differ ({listed}): a best head is the largest of a different number of "
        "heads in each model, so compare the head means."
    )


def mass_cell(row: Mapping[str, Any], col: str, counts: bool = True) -> str:
    """An over-seeds cell: mean; median; lowest to highest (; seeds above each threshold). No
    interval: a percentile bootstrap over 3-5 seeds covers the mean far less often than its
    nominal level (measure.seed_stats.bootstrap_coverage); every seed's value is in the per-seed
    tables."""
    mean = row.get(col, math.nan)
    if _missing(mean):
        return DASH
    cell = f"{mean:.3f}; {row[f'{col}_median']:.3f}; "
    cell += f"{row[f'{col}_min']:.3f} to {row[f'{col}_max']:.3f}"
    if counts:
        cell += "; " + " / ".join(str(int(row[threshold_column(col, t)])) for t in THRESHOLDS)
    return cell


def seed_cell(row: Mapping[str, Any], col: str) -> str:
    """A per-seed cell: value [95% bootstrap interval over rows]."""
    value, lo, hi = (row.get(f"{col}{s}", math.nan) for s in SUFFIXES)
    if _missing(value):
        return DASH
    return f"{value:.3f}" if _missing(lo) else f"{value:.3f} [{lo:.3f}, {hi:.3f}]"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def table(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    return markdown_table(list(header), [list(line) for line in lines])


def named_table(name: str, header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    """A README table block (smelt_interp.results): readme_figures copies it, by `name`, into
    the pages that show it."""
    return table_block(name, table(header, lines))


def _lv(r: Mapping[str, Any]) -> str:
    return f"{int(r['layer'])}.{int(r['visit'])}"


def _recs(frame: pd.DataFrame | None) -> list[dict[str, Any]]:
    return [] if frame is None else frame.to_dict("records")


def pair_parts(pairs: pd.DataFrame, per_seed: Mapping[str, pd.DataFrame]) -> list[str]:
    """The visit pairs' caption and table (every seed, exact tests), then the paper's
    comparison (commands.seed_comparisons.did_part)."""
    return [
        "Visit 1 - visit 0 of each looped layer, paired within each seed: the head mean, "
        "and the same head at both visits (the head with the most mass at visit 0 on "
        "selection rows apart from the rows reported; its index is saved per seed). Cells: "
        "each seed's value, the median and the range; how many seeds fall each way, with the "
        "exact two-sided sign test and sign-flip permutation test.",
        named_table(
            "visit-pairs",
            ["model", "layer", "statistic", "visit 1 - visit 0"],
            [
                [r["model"], str(int(r["layer"])), PAIR_NAMES[c]]
                + [pair_tests(per_seed["pairs"], r["model"], r["layer"], c)]
                for r in _recs(pairs)
                for c in PAIR_STATS
            ],
        ),
        *did_part(per_seed["visits"]),
    ]


def _non_answer_parts(by_visit: pd.DataFrame, split: pd.DataFrame | None) -> list[str]:
    """The non-answer positions: BOS mass, then the split of attention, with the caption."""
    return [
        "Second view, the non-answer positions: BOS mass (mean over heads and best head, beside "
        "uniform attention's), then attention split into BOS, previous token, self and the rest "
        "(head means; uniform attention's in brackets) and its entropy (nats).",
        named_table(
            "non-answer-bos",
            ["model", "layer.visit", "BOS, head mean", "BOS, best head", "BOS, uniform"],
            [
                [r["model"], _lv(r), mass_cell(r, "na_bos_mean"), mass_cell(r, "na_bos_best")]
                + [f"{r['na_bos_uniform']:.3f}"]
                for r in _recs(by_visit)
            ],
        ),
        named_table(
            "non-answer-split",
            ["model", "layer.visit", "BOS", "previous token", "self", "rest", "entropy"],
            [
                [r["model"], _lv(r)]
                + [
                    f"{mass_cell(r, s, counts=s != 'entropy')} ({r[f'{s}_uniform']:.3f})"
                    for s in SPLIT_STATS
                ]
                for r in _recs(split)
            ],
        ),
    ]


def _control_parts(control: pd.DataFrame) -> list[str]:
    """The control rows' masses (repeat_successor=False), with their caption."""
    return [
        "Control rows (repeat_successor=False: every occurrence of a trigger draws a fresh "
        "successor, so the answer cannot be read off the demonstrations), measured by the "
        "same probe: demonstration mass at the answer positions should stay near its share "
        "of the keys.",
        named_table(
            "control",
            ["model", "layer.visit", "demo, head mean", "demo, best head", "demo share"]
            + ["BOS, head mean", "BOS, best head", "BOS, uniform"],
            [
                [r["model"], _lv(r), mass_cell(r, "demo_mean"), mass_cell(r, "demo_best")]
                + [f"{r['demo_share']:.3f}", mass_cell(r, "bos_mean")]
                + [mass_cell(r, "bos_best"), f"{r['bos_uniform']:.3f}"]
                for r in _recs(control)
            ],
        ),
    ]


def over_seed_parts(
    summary: Mapping[str, pd.DataFrame], per_seed: Mapping[str, pd.DataFrame], positions: str
) -> list[str]:
    """The over-seeds tables (answer positions, visit pairs, non-answer split, control) with
    their captions; `positions` names what the answer positions are measured on."""
    by_visit = summary["visits"]
    n = int(by_visit["n_seeds"].max())
    cut = " / ".join(f"> {t:g}" for t in THRESHOLDS)
    parts = [
        f"Over {n} seeds, each mass cell: mean; median; lowest to highest seed; seeds {cut}. No "
        "interval: a nominal 95% percentile bootstrap over 3 seeds covers the mean about 73% of "
        "the time and over 5 about 85% (simulated, measure.seed_stats); every seed's value is in "
        "the per-seed tables below. Uniform attention's levels "
        "(chance) are the mean over the answer positions of 1 / (position + 1) for BOS and of the "
        "demonstration answers' share of the keys each position sees.",
        head_count_note(per_seed["visits"]),
        f"Answer positions ({positions}), the paper's quantity: BOS and demonstration-answer "
        "(demo) mass per layer and visit, mean over heads and best head.",
        named_table(
            "answer",
            ["model", "layer.visit", "heads", "BOS, head mean", "BOS, best head", "BOS, uniform"]
            + ["demo, head mean", "demo, best head", "demo share of keys"],
            [
                [r["model"], _lv(r), f"{r['n_heads']:.0f}"]
                + [mass_cell(r, "bos_mean"), mass_cell(r, "bos_best"), f"{r['bos_uniform']:.3f}"]
                + [mass_cell(r, "demo_mean"), mass_cell(r, "demo_best")]
                + [f"{r['demo_share']:.3f}"]
                for r in _recs(by_visit)
            ],
        ),
    ]
    if "pairs" in summary:
        parts += pair_parts(summary["pairs"], per_seed)
    parts += _non_answer_parts(by_visit, summary.get("split"))
    if "control" in summary:
        parts += _control_parts(summary["control"])
    return parts


def per_seed_part(visits: pd.DataFrame) -> str:
    """Each seed's answer-position figures: value [95% bootstrap interval over rows]; which
    head is best in brackets."""
    return table(
        ["seed", "model", "layer.visit", "BOS, head mean", "BOS, best head", "demo, head mean"]
        + ["demo, best head", "non-answer BOS, head mean", "non-answer BOS, best head"],
        [
            [str(r["seed"]), r["model"], _lv(r)]
            + [seed_cell(r, "bos_mean"), _best(r, "bos"), seed_cell(r, "demo_mean")]
            + [_best(r, "demo"), seed_cell(r, "na_bos_mean"), _best(r, "na_bos")]
            for r in _recs(visits)
        ],
    )


def _best(r: Mapping[str, Any], name: str) -> str:
    return f"{seed_cell(r, f'{name}_best')} (head {int(r[f'{name}_best_head'])})"
