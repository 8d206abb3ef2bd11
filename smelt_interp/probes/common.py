"""What the probes check and index alike: the (layer, visit) -> effective-depth index, the loop
span a per-visit table is summarised over, and the checks a probe makes of a model (batching
and capture are measure.batching's)."""

from __future__ import annotations

import pandas as pd

from smelt_interp.errors import ProbeError
from smelt_interp.model.protocol import LoopedModel


def depth_index(model: LoopedModel) -> dict[tuple[int, int], int]:
    """(layer, visit) -> its position in execution order (0-based effective depth)."""
    return {lv: d for d, lv in enumerate(model.schedule)}


def loop_span(frame: pd.DataFrame) -> list[int]:
    """The layers of a per-(layer, visit) table that run more than once; for a Baseline's table
    the span the paper's recipe would loop (L/4 .. 3L/4 - 1), so a Baseline/SMELT pair is
    summarised over the same layers."""
    looped = sorted(frame.loc[frame["visit"] > 0, "layer"].unique().tolist())
    if looped:
        return looped
    n = int(frame["layer"].max()) + 1
    return list(range(n // 4, (3 * n) // 4)) or list(range(n))


def require_looped(model: LoopedModel, probe: str) -> None:
    """Raise ProbeError for a model whose layers each run once (a Baseline)."""
    if not model.cfg.is_looped:
        name = model.cfg.name or "this model"
        raise ProbeError(
            f"{probe} compares two visits of a layer, but {name} is not looped "
            f"(one visit per layer)"
        )


def check_visit(model: LoopedModel, layer: int, visit: int) -> None:
    """Raise ProbeError unless (layer, visit) is executed by the model."""
    if (layer, visit) not in depth_index(model):
        raise ProbeError(
            f"layer {layer} visit {visit} does not exist; the schedule is {list(model.schedule)}"
        )
