"""The paper's quantity on one example, for the views that show one recall row or one Dyck
prompt: per (model, layer, visit), the mass from the answer positions on BOS and on the
demonstration answers as the mean over heads with the best head beside it, and what uniform
attention would put there on the same positions (measure.position_mass and
measure.levels compute them; this module lays them out)."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
from dash import html

from smelt_interp.app import components as ui
from smelt_interp.measure import case_heads

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
