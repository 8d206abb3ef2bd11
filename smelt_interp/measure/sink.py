"""The attention-sink statistic, written once: per (layer, visit, head), the attention that valid
queries i >= 1 put on key 0 (BOS), kept per query position as its BOS column: recomputed from a
visit's cached Q and K a chunk of queries at a time (`bos_columns`, the probes' path: one
forward pass gives every window), read from each visit's `hook_pattern` as the hook fires
(`bos_column_sums`, the trainer's evaluation), or for one prompt (`first_key_shares`, the
dashboard, also from its materialised pattern: `pattern_bos_share`). Every path reduces rows to
the column in one place, `first_key_columns`, with the learned-sink slot beside it. No [T, T]
pattern is kept on the first two paths; measure.head_masses pools the columns per (layer,
visit, head) for the sink probe.

Sink^0.3 is the metric of "When Attention Sink Emerges in Language Models" (ICLR 2025), computed
as they do, per sample with query 0 kept, in measure.sink_gu. This module's figure on 64-token
windows (sink03_64) is the pooled one: every row's queries 1..63 pooled, the threshold applied
once to the pooled mass. Attention is causal, so cutting a row is the same as keeping its first
64 queries. `sink03_table` gives both, each with a bootstrap interval over rows (the case
study's `sink` table).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from smelt_interp.measure.attention_stats import DEFAULT_CHUNK, row_chunks
from smelt_interp.measure.intervals import LEVEL, N_RESAMPLES, interval, pooled, resample_weights
from smelt_interp.measure.position_mass import RowsFn, pattern_rows, qk_rows
from smelt_interp.measure.sink_gu import (
    GU_KEY,
    THRESHOLD,
    WINDOW,
    gu_sink03,
    importance_from_pattern,
    sample_shares,
)
from smelt_interp.model.protocol import autocast_for
from smelt_interp.model.transformer import SmeltModel

# A sink head: BOS mass at the non-answer positions (attention with nothing to retrieve) of at
# least this much; the case study's sink target and the parked head of the head ablation.
SINK_BOS = 0.5
# A sink that stays, not one that passes: the mass must hold over this many last evaluations.
HOLD_EVALS = 5


def held_mass(series: Sequence[float], last: int = HOLD_EVALS) -> float:
    """The lowest of a head's last `last` evaluations of a mass (what it held at least); NaN
    with fewer evaluations than that."""
    tail = list(series)[-last:]
    return min(tail) if len(tail) == last and last > 0 else math.nan


def best_held(series: Mapping[str, Sequence[float]], last: int = HOLD_EVALS) -> tuple[str, float]:
    """(head, held mass) of the head whose series held highest (held_mass); ("none", NaN) when
    no head has `last` evaluations."""
    held = {head: held_mass(values, last) for head, values in series.items()}
    held = {head: mass for head, mass in held.items() if not math.isnan(mass)}
    if not held:
        return "none", math.nan
    best = max(held, key=held.__getitem__)
    return best, held[best]


def bos_columns(
    q: torch.Tensor,
    k: torch.Tensor,
    valid: torch.Tensor,
    chunk: int | None = DEFAULT_CHUNK,
    hidden: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention on key 0 of every valid query i >= 1, [b, H, T] float64 (0 elsewhere), from one
    visit's cached post-RoPE Q [b, T, H, d] and K; only each chunk's BOS column is kept. Summed
    over rows and the first w positions it is the mass of a w-token window (attention is
    causal: cutting a row keeps its first w queries as they were)."""
    return first_key_columns(qk_rows(q, k, hidden), valid.to(q.device), chunk)[0]


def first_key_columns(
    rows_of: RowsFn, valid: torch.Tensor, chunk: int | None = DEFAULT_CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """bos_columns for any source of rows (measure.position_mass.visit_rows), with the mass
    the rows leave off the keys beside it: (first key [b, H, T], sink slot [b, H, T]), float64,
    0 at invalid queries and at i = 0. The slot column is 1 minus a row's sum, which is the
    mass a learned sink logit takes; it is rounding noise for a model without one."""
    b, t = valid.shape
    first: torch.Tensor | None = None
    slot: torch.Tensor | None = None
    for pos, rows in row_chunks(rows_of, t, chunk, valid.device):
        if first is None or slot is None:
            first = torch.zeros(b, rows.shape[1], t, dtype=torch.float64, device=valid.device)
            slot = torch.zeros_like(first)
        keep = (valid[:, pos] & (pos >= 1)[None, :])[:, None, :]
        # in float64 without a float64 copy of the chunk (the trainer's rows are whole patterns)
        column = rows[..., 0].double().to(valid.device)
        total = rows.sum(dim=-1, dtype=torch.float64).to(valid.device)
        first[:, :, pos] = column * keep
        slot[:, :, pos] = (1.0 - total) * keep
    assert first is not None and slot is not None  # t >= 1
    return first, slot


def first_key_shares(
    rows_of: RowsFn, t: int, chunk: int | None = DEFAULT_CHUNK
) -> tuple[np.ndarray, np.ndarray]:
    """Per head, one row's mean over its queries 1..t-1 of the attention on key 0 and on a
    learned sink slot (first_key_columns): ([H], [H]) float64. A one-token row's only query is
    key 0 itself, which is all it sees: its own row is the mean."""
    if t < 2:
        rows = rows_of(torch.zeros(1, dtype=torch.long), 1).double()[0, :, 0]  # [H, 1]
        return rows[:, 0].cpu().numpy(), (1.0 - rows.sum(dim=-1)).cpu().numpy()
    valid = torch.ones(1, t, dtype=torch.bool)
    first, slot = first_key_columns(rows_of, valid, chunk)
    return (
        (first[0].sum(dim=1) / (t - 1)).cpu().numpy(),
        (slot[0].sum(dim=1) / (t - 1)).cpu().numpy(),
    )


def pattern_bos_share(weights: np.ndarray) -> np.ndarray:
    """Per head, the mean attention of queries 1.. on BOS of one prompt's pattern [H, T, T]:
    [H] (first_key_shares of its rows; a one-token prompt's only query is BOS itself)."""
    return first_key_shares(pattern_rows(torch.from_numpy(weights)[None]), weights.shape[1])[0]


@torch.no_grad()
def bos_column_sums(
    model: SmeltModel,
    tokens: torch.Tensor,
    valid: torch.Tensor,
    importance: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sums [n_visits, n_heads, T], counts [T]), float64 on the CPU: at each query position,
    the attention on key 0 summed over the rows where that query is valid and i >= 1, visits in
    `model.schedule` order; counts is how many rows were summed at each position. Any window
    w then gives its mean as sums[..., :w].sum(-1) / counts[:w].sum(). With `importance` (a
    dict to fill), each visit's per-row first-key importance [b, H] over the first WINDOW queries
    (measure.sink_gu, Gu et al.'s Sink^0.3) is put there under its hook name, from the same pass."""

    device = next(model.parameters()).device
    keep = valid.to(device).clone()
    keep[:, 0] = False  # first_key_columns leaves i = 0 out too; the counts must agree
    names = model.hook_names("attn.hook_pattern")
    sums: dict[str, torch.Tensor] = {}

    def grab(pattern: torch.Tensor, hook) -> None:
        first, _ = first_key_columns(pattern_rows(pattern), keep)  # [b, H, T]
        sums[hook.name] = first.sum(dim=0).cpu()
        if importance is not None:
            importance[hook.name] = importance_from_pattern(pattern, valid.to(device)).cpu()

    with autocast_for(device):
        model.run_with_hooks(tokens.to(device), fwd_hooks=[(name, grab) for name in names])
    return torch.stack([sums[name] for name in names]), keep.sum(dim=0).double().cpu()


def row_window_sums(
    model: SmeltModel, tokens: torch.Tensor, valid: torch.Tensor, window: int = WINDOW
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of `tokens` on its own: its BOS mass summed over the queries 1..window-1, how
    many counted, and its Sink^0.3 as Gu et al. compute it (measure.sink_gu: the share of
    (visit, head)s whose first-key importance exceeds THRESHOLD): (sums [n, n_visits,
    n_heads], counts [n], gu [n]), for intervals over rows (measure.intervals.pooled turns
    them into means)."""
    sums, counts, gu = [], [], []
    for row in range(tokens.shape[0]):
        at = slice(row, row + 1)
        importance: dict[str, torch.Tensor] = {}
        s, c = bos_column_sums(model, tokens[at, :window], valid[at, :window], importance)
        sums.append(s.sum(dim=-1).numpy())
        counts.append(float(c.sum()))
        gu.append(float(sample_shares(list(importance.values()), THRESHOLD)[0]))
    return np.stack(sums), np.array(counts), np.array(gu)


def window_mass(
    sums: torch.Tensor, counts: torch.Tensor, window: int | None = None
) -> torch.Tensor:
    """Mean BOS mass [n_visits, n_heads] over the queries before `window` (all when None);
    NaN where no query counted."""
    w = sums.shape[-1] if window is None else window
    return sums[..., :w].sum(dim=-1) / counts[:w].sum()


def sink_share(mass: torch.Tensor, threshold: float = THRESHOLD) -> float:
    """Share of heads (all entries of `mass`) whose BOS mass exceeds `threshold`."""
    return float((mass > threshold).double().mean())


def sink_record(
    model: SmeltModel,
    tokens: torch.Tensor,
    valid: torch.Tensor,
    window: int = WINDOW,
    threshold: float = THRESHOLD,
) -> dict[str, float]:
    """What the trainer's evaluation logs, from one pass over a held-out batch: the mean BOS
    mass over heads per (layer, visit) at the batch's length ("sink_mass/{layer}.{visit}"),
    Sink^0.3 as Gu et al. compute it on the first WINDOW tokens ("sink03_gu", per row), and the
    pooled figure on `window`-token windows ("sink03_64" for the default window: every row's
    queries 1..63 pooled, thresholded once; the key older logs carry)."""

    importance: dict[str, torch.Tensor] = {}
    sums, counts = bos_column_sums(model, tokens, valid, importance)
    full = window_mass(sums, counts)
    record = {
        f"sink_mass/{layer}.{visit}": float(full[i].mean())
        for i, (layer, visit) in enumerate(model.schedule)
    }
    record[GU_KEY] = gu_sink03(list(importance.values()), threshold)
    record[f"sink03_{window}"] = sink_share(window_mass(sums, counts, window), threshold)
    return record


def sink03_table(
    model: SmeltModel,
    tokens: torch.Tensor,
    valid: torch.Tensor,
    *,
    seed: int = 0,
    level: float = LEVEL,
) -> pd.DataFrame:
    """One row: n_rows; sink03_gu (+_lo/_hi), Sink^0.3 as Gu et al. compute it on the rows'
    first WINDOW tokens (per row, the share of (visit, head)s whose first-key importance exceeds
    0.3, averaged over rows: measure.sink_gu); and sink03_64 (+_lo/_hi), the pooled figure (the
    share of (visit, head)s whose BOS mass over every row's queries 1..WINDOW-1, pooled, exceeds
    0.3); each with its bootstrap interval over rows."""
    sums, counts, per_row = row_window_sums(model, tokens, valid, WINDOW)
    weights = resample_weights(len(counts), N_RESAMPLES, seed)
    point, boot = pooled(sums, counts, weights)
    shares = (boot > THRESHOLD).reshape(len(boot), -1).mean(axis=1)
    lo, hi = interval(shares, level)
    gu_point, gu_boot = pooled(per_row, np.ones(len(per_row)), weights)
    gu_lo, gu_hi = interval(gu_boot, level)
    return pd.DataFrame(
        [
            {
                "n_rows": len(counts),
                GU_KEY: float(gu_point),
                f"{GU_KEY}_lo": float(gu_lo),
                f"{GU_KEY}_hi": float(gu_hi),
                f"sink03_{WINDOW}": sink_share(torch.from_numpy(point)),
                f"sink03_{WINDOW}_lo": float(lo),
                f"sink03_{WINDOW}_hi": float(hi),
            }
        ]
    )
