"""The paper's quantity on one example, for the views that show one recall row or one Dyck
prompt: per (model, layer, visit), the mass from the answer positions on BOS and on the
demonstration answers as the mean over heads with the best head beside it, and what uniform
attention would put there on the same positions (figures.case_heads does the arithmetic)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from dash import html

from smelt_interp.app import components as ui
from smelt_interp.figures import case_heads

NOT_TRAINED = "not trained on this task"
COLUMNS = (
    "model",
    "trained on this task",
    "layer",
    "visit",
    "heads",
    "BOS (answer), head mean",
    "BOS (answer), best head",
    "demonstrations (answer), head mean",
    "demonstrations (answer), best head",
)


def pattern_heads(
    patterns: Mapping[tuple[int, int], np.ndarray],
    answer: Sequence[int],
    demos: Mapping[int, Sequence[int]],
) -> pd.DataFrame:
    """Per (layer, visit, head) of one row's attention patterns ({(layer, visit): [H, T, T]}, in
    schedule order), the mean over its answer positions of the mass on BOS and on their
    demonstration answers: columns layer, visit, depth, head, bos_mass, demo_mass."""
    rows = []
    for depth, ((layer, visit), weights) in enumerate(patterns.items()):
        for head in range(weights.shape[0]):
            bos = [weights[head, q, 0] for q in answer]
            demo = [weights[head, q, [k for k in demos[q] if k != 0]].sum() for q in answer]
            rows.append(
                {
                    "layer": layer,
                    "visit": visit,
                    "depth": depth,
                    "head": head,
                    "bos_mass": float(np.mean(bos)) if bos else float("nan"),
                    "demo_mass": float(np.mean(demo)) if demo else float("nan"),
                }
            )
    return pd.DataFrame(rows)


def uniform_levels(answer: Sequence[int], demos: Mapping[int, Sequence[int]]) -> dict[str, float]:
    """Uniform attention at these answer positions q: BOS gets 1 / (q + 1), the demonstration
    answers their count over q + 1; each averaged over the positions."""
    if not answer:
        return {}
    shares = [len([k for k in demos[q] if k != 0]) / (q + 1) for q in answer]
    return {
        "uniform_bos": float(np.mean([1 / (q + 1) for q in answer])),
        "demo_share": float(np.mean(shares)),
    }


def levels_text(levels: Mapping[str, float]) -> str:
    if not levels:
        return ""
    return (
        f"uniform attention at these answer positions: BOS {levels['uniform_bos']:.3f}, "
        f"demonstration answers {levels['demo_share']:.3f} (their share of the keys)"
    )


def quantity_table(heads: Mapping[str, pd.DataFrame], trained: Mapping[str, bool]) -> html.Table:
    """One row per (model, layer, visit): head means and the best head, models trained on the
    task first and the others marked."""
    rows = []
    for name in sorted(heads, key=lambda n: not trained.get(n, False)):
        summary = case_heads.head_summary(heads[name])
        for r in summary.itertuples():
            rows.append(
                [
                    name,
                    "yes" if trained.get(name) else NOT_TRAINED,
                    int(r.layer),
                    int(r.visit),
                    int(r.n_heads),
                    f"{r.bos_mass:.3f}",
                    f"{r.bos_mass_best:.3f} (head {int(r.bos_mass_best_head)})",
                    f"{r.demo_mass:.3f}",
                    f"{r.demo_mass_best:.3f} (head {int(r.demo_mass_best_head)})",
                ]
            )
    return ui.table(list(COLUMNS), rows, class_name="case-quantity")
