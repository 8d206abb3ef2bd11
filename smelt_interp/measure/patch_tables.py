"""The patching tables a probe, the command, the notebook and the dashboard show: activation and
attribution patching side by side per (layer, visit, head) and per (layer, visit), cross-visit
patching per looped layer, the nodes that move the metric most, and the headline numbers
(measure.patching and measure.path_patching compute each value)."""

from __future__ import annotations

import math

import pandas as pd

from smelt_interp.data.patch_pairs import PromptPair
from smelt_interp.measure.patching import (
    DEFAULT_COPIES,
    activation_patching,
    attribution_patching,
    correlation,
    nodes_of,
    prepared,
)
from smelt_interp.measure.path_patching import cross_visit_patching
from smelt_interp.model.protocol import LoopedModel

VISIT_SITES = ("resid_pre", "attn_out", "mlp_out", "resid_post")
KEYS = ["layer", "visit", "site", "head", "position"]


def side_by_side(
    model: LoopedModel,
    pair: PromptPair,
    site: str = "z",
    *,
    per_head: bool = False,
    per_position: bool = False,
    metric: str = "logit_diff",
    batch: int = DEFAULT_COPIES,
    activation: bool = True,
) -> pd.DataFrame:
    """Per node of `site`: `depth` (its place in the schedule), `activation` (the normalised
    activation-patching effect; NaN with `activation=False`, which runs attribution alone: one
    backward pass instead of a forward per node) and `attribution` (its first-order estimate),
    one table."""
    pair = prepared(model, pair)
    nodes = nodes_of(model, site, per_head=per_head, per_position=per_position, length=pair.length)
    attr = attribution_patching(model, pair, nodes, metric=metric)
    depth = {where: d for d, where in enumerate(model.schedule)}
    frame = attr[KEYS].copy()
    frame.insert(2, "depth", [depth[lv] for lv in zip(frame["layer"], frame["visit"])])
    frame["activation"] = math.nan
    frame.attrs.update(attr.attrs)  # the metric on both prompts
    if activation:
        act = activation_patching(model, pair, nodes, metric=metric, batch=batch)
        frame["activation"] = act["effect"].to_numpy()
        frame.attrs.update(act.attrs)
    frame["attribution"] = attr["effect"].to_numpy()
    return frame


def patching_cost(model: LoopedModel, pair: PromptPair, n_nodes: int) -> float:
    """Parameter-token products activation patching of `n_nodes` nodes runs (every node
    patched into every row of the pair): what a caller weighs before asking for it."""
    n_params = sum(p.numel() for p in model.parameters())
    return float(n_nodes) * pair.n_rows * pair.length * n_params


def visit_sites(
    model: LoopedModel,
    pair: PromptPair,
    *,
    metric: str = "logit_diff",
    batch: int = DEFAULT_COPIES,
) -> pd.DataFrame:
    """side_by_side per (layer, visit) for the residual stream before and after, the attention
    output and the MoE/MLP write, stacked."""
    parts = [side_by_side(model, pair, site, metric=metric, batch=batch) for site in VISIT_SITES]
    frame = pd.concat(parts, ignore_index=True)
    frame.attrs.update(parts[0].attrs)
    return frame


def cross_visits(
    model: LoopedModel,
    pair: PromptPair,
    site: str = "z",
    *,
    metric: str = "logit_diff",
    batch: int = DEFAULT_COPIES,
) -> pd.DataFrame:
    """cross_visit_patching per head of `site` (an empty table for a model with no loop)."""
    if not model.cfg.is_looped:
        return pd.DataFrame(columns=[*KEYS[:2], "source_visit", *KEYS[2:], "metric", "effect"])
    return cross_visit_patching(model, pair, site, per_head=True, metric=metric, batch=batch)


def top_nodes(frame: pd.DataFrame, n: int = 5, column: str = "activation") -> pd.DataFrame:
    """The `n` rows of largest |column|, largest first."""
    order = frame[column].abs().sort_values(ascending=False).index[:n]
    return frame.loc[order]


def node_label(row: pd.Series) -> str:
    """'1.1 h0' for a head, '1.1 attn_out' for a visit's site, '@5' appended for a position."""
    text = f"{int(row['layer'])}.{int(row['visit'])}"
    text += f" h{int(row['head'])}" if row["head"] >= 0 else f" {row['site']}"
    return text + (f" @{int(row['position'])}" if row["position"] >= 0 else "")


def headline(heads: pd.DataFrame, cross: pd.DataFrame) -> list[tuple[str, float]]:
    """The numbers a summary shows: the metric on both prompts, the top head's effect, the
    attribution-activation correlations, and the largest cross-visit loss (a table of
    attribution alone: its top head, and no correlations)."""
    rows = [
        ("metric on the clean prompt", heads.attrs.get("clean", math.nan)),
        ("metric on the corrupted prompt", heads.attrs.get("corrupt", math.nan)),
    ]
    if heads["activation"].isna().all():
        top = top_nodes(heads, 1, "attribution")
        label = f"top head's attribution estimate ({node_label(top.iloc[0])})"
        rows.append((label, float(top["attribution"].iloc[0])))
    else:
        stats = correlation(
            heads.rename(columns={"activation": "effect"}),
            heads.rename(columns={"attribution": "effect"})[["effect"]],
        )
        top = top_nodes(heads, 1)
        rows += [
            (f"top head's effect ({node_label(top.iloc[0])})", float(top["activation"].iloc[0])),
            ("attribution vs activation, Pearson r", stats["pearson"]),
            ("attribution vs activation, Spearman rho", stats["spearman"]),
        ]
    if len(cross):
        worst = cross.loc[cross["effect"].idxmin()]
        rows.append(
            (
                f"cross-visit: lowest effect ({int(worst['layer'])}.{int(worst['visit'])} h"
                f"{int(worst['head'])} given visit {int(worst['source_visit'])})",
                float(worst["effect"]),
            )
        )
    return rows
