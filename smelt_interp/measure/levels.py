"""Chance levels, written once: what uniform attention (every causally visible key alike) would
put on a key set, so that a measured mass can be read against chance. A query at position q
sees keys 0..q, so uniform attention gives a set of s visible keys s / (q + 1): BOS (one key)
1 / (q + 1), a query's demonstration answers their count over q + 1. A level over many queries
is the mean of theirs.

The sink probe's level (`uniform_bos`, over each row's valid queries i >= 1), the case study's
per demonstration count (`case_levels`, from the position sets), a single prompt's
(`answer_levels`) and a recall row's (`uniform_bos_share`) all reduce to `chance_level`. The
tensor form beside a measured mass, summed per position group as the probe measures it, is
position_mass.uniform_masses; `group_levels` turns its sums into the same table as
`case_levels`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from smelt_interp.measure.case_positions import KEY_SETS, CasePositions


def chance_level(
    queries: Sequence[int] | np.ndarray, set_sizes: Sequence[int] | np.ndarray | None = None
) -> float:
    """Mean over the query positions q of uniform attention's mass on a set of `set_sizes[i]`
    visible keys (one, BOS, when None): mean of s / (q + 1). NaN for no queries."""
    q = np.asarray(queries, dtype=np.float64)
    if q.size == 0:
        return math.nan
    sizes = np.ones_like(q) if set_sizes is None else np.asarray(set_sizes, dtype=np.float64)
    return float(np.mean(sizes / (q + 1.0)))


def uniform_bos(lengths: torch.Tensor | Sequence[int], window: int | None = None) -> float:
    """Uniform attention's BOS mass over every row's valid queries i >= 1 (only those before
    `window` when given), pooled over rows: the sink probe's reference."""
    queries: list[int] = []
    for n in [int(n) for n in lengths]:
        n = n if window is None else min(n, window)
        queries.extend(range(1, n))
    return chance_level(queries)


def uniform_bos_share(length: int) -> float:
    """Uniform attention's BOS mass over the queries 1..length-1 of one row of `length` tokens
    (about 0.02 at 256 tokens); 1.0 for a row with no query after BOS (BOS sees only itself)."""
    return 1.0 if length < 2 else uniform_bos([length])


def answer_levels(answer: Sequence[int], demos: Mapping[int, Sequence[int]]) -> dict[str, float]:
    """At one prompt's answer positions q: `uniform_bos`, and `demo_share`, the demonstration
    answers' (key 0 left out, it is BOS) share of the q + 1 visible keys; {} with no answer."""
    if not answer:
        return {}
    sizes = [len([k for k in demos[q] if k != 0]) for q in answer]
    return {"uniform_bos": chance_level(answer), "demo_share": chance_level(answer, sizes)}


LEVEL_COLUMNS = ["n_demos", "n", "uniform_bos", "demo_share"]


def pooled_level(reference: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Uniform attention's level on each key set over every position of some rows, pooled:
    its sums per row, reference [n, S] (position_mass.uniform_masses), over the positions
    counted, counts [n]: [S] (NaN where none counted)."""
    return reference.sum(axis=0) / counts.sum()


def group_levels(reference: np.ndarray, counts: np.ndarray) -> pd.DataFrame:
    """`case_levels`' table from uniform attention's sums per row and position group,
    reference [n, G, S] (position_mass.uniform_masses: key sets in KEY_SETS order, group g <
    G - 1 the answer positions with g demonstrations, the last the non-answer positions) and
    the positions counted, counts [n, G]."""
    bos, demo = KEY_SETS.index("bos"), KEY_SETS.index("demo")
    n = counts.sum(axis=0)  # [G]
    rows = []
    for g in range(len(n)):
        if n[g] > 0:
            level = pooled_level(reference[:, g], counts[:, g])
            answer = g < len(n) - 1
            rows.append(
                {
                    "n_demos": g if answer else -1,
                    "n": int(n[g]),
                    "uniform_bos": float(level[bos]),
                    "demo_share": float(level[demo]) if answer else math.nan,
                }
            )
    return pd.DataFrame(rows, columns=LEVEL_COLUMNS)


def case_levels(positions: CasePositions) -> pd.DataFrame:
    """The case study's levels on the position sets it measured: per n_demos of the answer
    positions, `uniform_bos` and `demo_share` (answer_levels pooled over every such position of
    every row), with `n` positions; and one row with n_demos -1 for the non-answer positions
    (its demo_share NaN)."""
    n_demos = positions.n_demos.cpu().numpy()
    non_answer = positions.non_answer.cpu().numpy()
    demos = positions.demos.cpu().numpy()
    width = n_demos.shape[1]
    causal = np.tril(np.ones((width, width), dtype=bool))
    causal[:, 0] = False  # BOS is its own key set, never a demonstration answer
    sizes = (demos & causal[None]).sum(axis=-1)  # [b, T] visible demonstration answers
    query = np.broadcast_to(np.arange(width), n_demos.shape)
    rows = []
    for n in sorted(int(v) for v in np.unique(n_demos) if v >= 0):
        at = n_demos == n
        rows.append(
            {
                "n_demos": n,
                "n": int(at.sum()),
                "uniform_bos": chance_level(query[at]),
                "demo_share": chance_level(query[at], sizes[at]),
            }
        )
    if non_answer.any():
        rows.append(
            {
                "n_demos": -1,
                "n": int(non_answer.sum()),
                "uniform_bos": chance_level(query[non_answer]),
                "demo_share": math.nan,
            }
        )
    return pd.DataFrame(rows, columns=LEVEL_COLUMNS)
