"""The seed tables' paired comparisons, each with every seed's value and an exact test
(measure.seed_stats): visit 1 - visit 0 of SMELT's looped layers, and the paper's comparison, a
difference in differences: SMELT's visit 1 - visit 0 of a looped layer against the Baseline's
change between its layers at the same effective depths (the Baseline's masses change with depth
too, so a second visit's change alone is not the paper's effect). Where the README or results
call a direction "the paper's" or "the opposite", it is this quantity."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from smelt_interp.measure.seed_stats import diff_in_diff, sign_flip_test, sign_test
from smelt_interp.results import markdown_table, table_block

DID_STATS = (
    ("demo_mean", "demo mass at the answers, head mean"),
    ("bos_mean", "BOS mass at the answers, head mean"),
    ("na_bos_mean", "BOS mass at the non-answer positions, head mean"),
)
DASH = "–"


def seeds_cell(values: Sequence[float], seeds: Sequence[int]) -> str:
    """Every seed's value (seed: value), the median and the range."""
    pairs = [(s, v) for s, v in zip(seeds, values) if not math.isnan(v)]
    if not pairs:
        return DASH
    x = pd.Series([v for _, v in pairs])
    listed = ", ".join(f"{s}: {v:+.3f}" for s, v in pairs)
    return f"{listed}; median {x.median():+.3f}; {x.min():+.3f} to {x.max():+.3f}"


def exact_tests_cell(values: Sequence[float]) -> str:
    """The exact two-sided sign test and sign-flip permutation test of paired differences."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return DASH
    negative, positive = sum(v < 0 for v in finite), sum(v > 0 for v in finite)
    return (
        f"{negative} -, {positive} +; sign p = {sign_test(finite):.3f}; "
        f"sign-flip p = {sign_flip_test(finite):.3f}"
    )


def schedule_of(visits: pd.DataFrame, model: str) -> list[tuple[int, int]]:
    """A model's (layer, visit)s in the order its seed tables list them (the probe's answer
    table runs in schedule order)."""
    part = visits[visits["model"] == model]
    first = part[part["seed"] == part["seed"].iloc[0]]
    return [(int(r["layer"]), int(r["visit"])) for _, r in first.iterrows()]


def did_frame(visits: pd.DataFrame) -> pd.DataFrame:
    """Per seed, looped layer and DID_STATS statistic: smelt_change (visit 1 - visit 0),
    baseline_change (the Baseline's layer at visit 1's effective depth minus its layer at visit
    0's) and did (their difference; NaN where the Baseline has no layer at a depth)."""
    if not {"smelt", "baseline"} <= set(visits["model"]):
        return pd.DataFrame()
    schedule = schedule_of(visits, "smelt")
    depth = {lv: d for d, lv in enumerate(schedule)}
    looped = sorted({layer for layer, visit in schedule if visit == 1})
    rows: list[dict[str, Any]] = []
    for seed, part in visits.groupby("seed", sort=True):
        smelt = part[part["model"] == "smelt"].set_index(["layer", "visit"])
        base = part[part["model"] == "baseline"].set_index("layer")
        for stat, _ in DID_STATS:
            s = {(int(lv[0]), int(lv[1])): float(v) for lv, v in smelt[stat].items()}
            b = {int(layer): float(v) for layer, v in base[stat].items()}
            for layer in looped:
                d0, d1 = depth[layer, 0], depth[layer, 1]
                change = s[layer, 1] - s[layer, 0]
                base_change = b[d1] - b[d0] if d0 in b and d1 in b else math.nan
                rows.append(
                    {"seed": int(seed), "layer": layer, "statistic": stat, "depths": (d0, d1)}
                    | {"smelt_change": change, "baseline_change": base_change}
                    | {"did": diff_in_diff(s, schedule, b, layer)}
                )
    return pd.DataFrame(rows)


def did_part(visits: pd.DataFrame) -> list[str]:
    """The paper's comparison as a caption and a named table (`paper-comparison`); nothing
    without both models."""
    frame = did_frame(visits)
    if frame.empty:
        return []
    lines = []
    for (layer, stat), part in frame.groupby(["layer", "statistic"], sort=False):
        seeds = part["seed"].tolist()
        d0, d1 = part["depths"].iloc[0]
        did = part["did"].tolist()
        lines.append(
            [str(layer), dict(DID_STATS)[stat], f"{d0} -> {d1}"]
            + [seeds_cell(part["smelt_change"].tolist(), seeds)]
            + [seeds_cell(part["baseline_change"].tolist(), seeds)]
            + [seeds_cell(did, seeds), exact_tests_cell(did)]
        )
    caption = (
        "The paper's comparison, a difference in differences per seed: SMELT's visit 1 - visit 0 "
        "of each looped layer, minus the Baseline's change between its layers at the same "
        "effective depths (the Baseline's layer l runs at depth l; – where it has no layer that "
        "deep). Cells: each seed's value, the median and the range; then how many seeds fall "
        "each way with the exact two-sided sign test and sign-flip permutation test (with n "
        "seeds neither can go below 2 / 2^n)."
    )
    header = ["layer", "statistic", "depths", "SMELT visit 1 - visit 0"]
    header += ["Baseline, same depths", "difference in differences", "exact tests"]
    return [caption, table_block("paper-comparison", markdown_table(header, lines))]


def pair_tests(pairs: pd.DataFrame, model: str, layer: int, column: str) -> str:
    """seeds_cell and exact_tests_cell of one visit-pair column of one model and layer."""
    part = pairs[(pairs["model"] == model) & (pairs["layer"] == layer)].sort_values("seed")
    values = part[column].tolist()
    return f"{seeds_cell(values, part['seed'].tolist())}; {exact_tests_cell(values)}"
