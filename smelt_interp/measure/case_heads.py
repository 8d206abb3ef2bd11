"""The case study's quantity as the paper states it, from the `case_study` probe's per-head rows:
per (layer, visit) the mean over heads (the paper's claim is over all heads) with the best head
beside it (does any head do it?), visit 1 minus visit 0 of the same head (a looped layer's
visits share their weights, so head h of visit 1 is head h of visit 0), and the non-answer
positions' BOS mass as head mean and top head. Uniform attention's levels beside them are
measure.levels'.

Pure pandas over the probe's tables; shared by the dashboard's case-study page, notebook 05 and
the figures."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from smelt_interp.measure.group_masses import STATS

ANSWER_STATS = ("bos_mass", "demo_mass")  # the paper's two masses at the answer positions
GROUP_KEYS = ("task", "n_demos", "layer", "visit", "depth")  # those a table has, in this order


def _keys(heads: pd.DataFrame) -> list[str]:
    return [k for k in GROUP_KEYS if k in heads.columns]


def head_summary(heads: pd.DataFrame, stats: tuple[str, ...] = ANSWER_STATS) -> pd.DataFrame:
    """Per (n_demos, layer, visit) of a per-head table (the probe's `heads`, or its
    `non_answer`): `n_heads`, and for each statistic its mean over heads (`{stat}`), the largest
    head's value (`{stat}_best`) and that head (`{stat}_best_head`). Sorted by depth."""
    keys = _keys(heads)
    columns = [*keys, "n_heads"]
    columns += [f"{s}{suffix}" for s in stats for suffix in ("", "_best", "_best_head")]
    if heads.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for key, part in heads.groupby(keys, sort=False):
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        row["n_heads"] = int(part["head"].nunique())
        for stat in stats:
            best = part.loc[part[stat].idxmax()]
            row[stat] = float(part[stat].mean())
            row[f"{stat}_best"] = float(best[stat])
            row[f"{stat}_best_head"] = int(best["head"])
        rows.append(row)
    order = [k for k in ("task", "n_demos", "depth") if k in keys]
    return pd.DataFrame(rows, columns=columns).sort_values(order, ignore_index=True)


def same_head_diff(heads: pd.DataFrame, stats: tuple[str, ...] = ANSWER_STATS) -> pd.DataFrame:
    """Visit 1 minus visit 0 of each head of each looped layer, the same head on both sides:
    columns [n_demos,] layer, head, statistic, visit_0, visit_1, diff. Empty for a model that
    visits no layer twice."""
    keys = [k for k in ("task", "n_demos") if k in heads.columns]
    columns = [*keys, "layer", "head", "statistic", "visit_0", "visit_1", "diff"]
    looped = heads[heads["visit"] == 1]["layer"].unique() if not heads.empty else []
    rows = []
    for layer in sorted(looped):
        part = heads[heads["layer"] == layer]
        first = part[part["visit"] == 0].set_index([*keys, "head"])
        second = part[part["visit"] == 1].set_index([*keys, "head"])
        for index in second.index.intersection(first.index):
            where = dict(zip([*keys, "head"], index if isinstance(index, tuple) else (index,)))
            for stat in stats:
                a, b = float(first.loc[index, stat]), float(second.loc[index, stat])
                rows.append(where | {"layer": int(layer), "statistic": stat} | _diff(a, b))
    return pd.DataFrame(rows, columns=columns)


def _diff(a: float, b: float) -> dict:
    return {"visit_0": a, "visit_1": b, "diff": b - a}


def non_answer_top_head(non_answer: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, visit), the row of the probe's `non_answer` table whose head has the most
    BOS mass, with its interval (a sink only where that mass is large: read it against uniform
    attention's level)."""
    if non_answer.empty:
        return non_answer
    best = non_answer.loc[non_answer.groupby(["layer", "visit"])["bos_mass"].idxmax()]
    return best.sort_values("depth").reset_index(drop=True)


def non_answer_head_mean(non_answer: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, visit), the mean over heads of the `non_answer` table's BOS mass."""
    if non_answer.empty:
        return non_answer
    keys = [k for k in ("task", "layer", "visit", "depth") if k in non_answer.columns]
    mean = non_answer.groupby(keys, as_index=False)["bos_mass"].mean()
    return mean.sort_values("depth").reset_index(drop=True)


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


@dataclass(frozen=True)
class HeadViews:
    """One model's case-study tables (one demonstration count) read head by head, as the
    dashboard and notebook 05 show them: `best` (head_summary of the answer positions' heads),
    `same_head` (same_head_diff), and at the non-answer positions `non_answer_mean`
    (non_answer_head_mean) and `non_answer_top` (non_answer_top_head)."""

    best: pd.DataFrame
    same_head: pd.DataFrame
    non_answer_mean: pd.DataFrame
    non_answer_top: pd.DataFrame


def head_views(heads: pd.DataFrame, non_answer: pd.DataFrame) -> HeadViews:
    """HeadViews of the probe's `heads` rows at one demonstration count and its `non_answer`
    table: every head-wise reading computed here, so the pages and figures only draw them."""
    return HeadViews(
        head_summary(heads),
        same_head_diff(heads),
        non_answer_head_mean(non_answer),
        non_answer_top_head(non_answer),
    )
