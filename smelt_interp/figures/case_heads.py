"""The case study's quantity as the paper states it, from the `case_study` probe's per-head rows:
per (layer, visit) the mean over heads (the paper's claim is over all heads) with the best head
beside it (does any head do it?), visit 1 minus visit 0 of the same head (a looped layer's
visits share their weights, so head h of visit 1 is head h of visit 0), and the levels that
uniform attention would give, so a mass can be read against chance.

Pure pandas and numpy over the probe's tables and the position sets of measure.case_positions;
shared by the dashboard's case-study page, notebook 05 and the figures."""

from __future__ import annotations

import numpy as np
import pandas as pd

from smelt_interp.data.dyck import dyck_batch
from smelt_interp.measure.case_positions import CasePositions, dyck_case, recall_case
from smelt_interp.probes.inputs import ProbeInputs

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


def reference_levels(positions: CasePositions) -> pd.DataFrame:
    """What uniform attention (every visible key alike) would put where the probe measures,
    from the position sets of the rows it measured: per n_demos of the answer positions,
    `uniform_bos` (the mean over those positions q of 1 / (q + 1)) and `demo_share` (the mean of
    the demonstration answers' share of the q + 1 visible keys), with `n` positions; and one row
    with n_demos -1 for the non-answer positions (its demo_share NaN)."""
    n_demos = positions.n_demos.cpu().numpy()
    non_answer = positions.non_answer.cpu().numpy()
    demos = positions.demos.cpu().numpy()
    n_keys = np.arange(n_demos.shape[1], dtype=np.float64) + 1.0  # keys 0..q visible at q
    width = n_demos.shape[1]
    causal = np.tril(np.ones((width, width), dtype=bool))
    causal[:, 0] = False  # BOS is its own key set, never a demonstration answer
    share = (demos & causal[None]).sum(axis=-1) / n_keys[None, :]  # [b, T]
    uniform = np.broadcast_to(1.0 / n_keys, n_demos.shape)
    rows = []
    for n in sorted(int(v) for v in np.unique(n_demos) if v >= 0):
        at = n_demos == n
        rows.append(
            {
                "n_demos": n,
                "n": int(at.sum()),
                "uniform_bos": float(uniform[at].mean()),
                "demo_share": float(share[at].mean()),
            }
        )
    if non_answer.any():
        rows.append(
            {
                "n_demos": -1,
                "n": int(non_answer.sum()),
                "uniform_bos": float(uniform[non_answer].mean()),
                "demo_share": float("nan"),
            }
        )
    return pd.DataFrame(rows, columns=["n_demos", "n", "uniform_bos", "demo_share"])


def case_positions(inputs: ProbeInputs) -> CasePositions:
    """The position sets of the rows or prompts the case-study probe measures on `inputs` (its
    task's held-out recall rows or in-context Dyck prompts), as the probe builds them."""
    if inputs.case_task == "dyck":
        examples = inputs.dyck_examples()
        tokens, lengths = dyck_batch(examples)
        return dyck_case(examples, tokens, lengths)
    return recall_case(inputs.recall_rows(), inputs.assoc_recall.trigger_ids)


def uniform_bos_share(length: int) -> float:
    """Uniform attention's mass on BOS averaged over the queries 1..length-1 of a row of
    `length` tokens: the mean of 1 / (q + 1) (about 0.02 at 256 tokens)."""
    if length < 2:
        return 1.0
    return float(np.mean(1.0 / (np.arange(1, length) + 1.0)))
