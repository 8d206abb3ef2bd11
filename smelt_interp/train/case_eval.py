"""The associative-recall case study during training: what the periodic evaluation records, from a
fixed batch of held-out rows, with the position sets (measure.case_positions) and the mass
computation (measure.position_mass) the case-study probe uses, so an eval record's numbers are the
probe's on the same rows and model.

Keys of an eval record (positions pooled over the rows):
- `case/bos_non_answer/{layer}.{visit}.{head}`: BOS mass at non-answer positions;
- `case/demo_answer/{layer}.{visit}.{head}` and `case/bos_answer/{layer}.{visit}.{head}`: the
  mass on the demonstration answers and on BOS at answer positions (a trigger seen before);
- `case/answer_acc`, `case/first_acc`: next-token argmax accuracy at answer positions and at
  first occurrences.
A key whose positions the batch lacks is left out."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from smelt_interp.data.assoc_recall import AssocRecallSpec
from smelt_interp.measure.case_positions import MAX_DEMOS, recall_case
from smelt_interp.measure.group_masses import group_of
from smelt_interp.measure.position_mass import group_counts, qk_hook_names, visit_masses
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.train.metrics import main_evals, read_metrics

CASE_ROWS = 12  # held-out rows per evaluation: a few hundred answer positions at 256 tokens
PREFIX = "case/"
PER_HEAD = ("bos_non_answer", "demo_answer", "bos_answer")
SCALARS = ("answer_acc", "first_acc")
HISTORY_COLUMNS = ("step", "tokens", "layer", "visit", "head", "statistic", "value")


@torch.no_grad()
def heldout_case(model: SmeltModel, rows: torch.Tensor, spec: AssocRecallSpec) -> dict[str, float]:
    """The record's `case/...` keys from the first CASE_ROWS of held-out rows [n, T] of `spec`."""
    device = next(model.parameters()).device
    rows = rows[:CASE_ROWS].to(device)
    case = recall_case(rows, spec.trigger_ids)
    n_groups = MAX_DEMOS + 2  # n_demos 0 .. MAX_DEMOS, then the non-answer positions
    groups = case.groups(n_groups)
    names = frozenset(qk_hook_names(model.schedule))
    logits, cache = model.run_with_cache(rows, names_filter=lambda n: n in names)
    hidden = model.hidden_keys(rows)
    sums = visit_masses(cache, model.schedule, groups, n_groups, case.key_sets(), hidden=hidden)
    sums = sums.cpu().numpy()
    counts = group_counts(groups, n_groups).cpu().numpy()  # [b, G]
    # the answer positions with a demonstration shown, then the non-answer positions
    shown = group_of(sums, counts, range(1, n_groups - 1)).head_masses(model.schedule)
    non = group_of(sums, counts, [n_groups - 1]).head_masses(model.schedule)
    per_head = {}
    if non.counts["bos_mass"] > 0:
        per_head["bos_non_answer"] = non.values["bos_mass"]
    if shown.counts["bos_mass"] > 0:
        per_head["demo_answer"], per_head["bos_answer"] = (
            shown.values["demo_mass"],
            shown.values["bos_mass"],
        )
    out: dict[str, float] = {}
    for stat, mass in per_head.items():
        for i, (layer, visit) in enumerate(model.schedule):
            for head in range(mass.shape[1]):
                out[f"{PREFIX}{stat}/{layer}.{visit}.{head}"] = float(mass[i, head])
    right = logits.argmax(dim=-1) == case.targets
    for key, where in (("answer_acc", case.n_demos >= 1), ("first_acc", case.n_demos == 0)):
        if where.any():
            out[PREFIX + key] = float(right[where].double().mean())
    return out


def _where(key: str) -> tuple[str, tuple[int, int, int] | None] | None:
    """(statistic, (layer, visit, head) or None) of a `case/...` key; None for any other key."""
    if not key.startswith(PREFIX):
        return None
    stat, _, where = key[len(PREFIX) :].partition("/")
    if stat in SCALARS and not where:
        return stat, None
    parts = where.split(".")
    if stat in PER_HEAD and len(parts) == 3 and all(p.isdigit() for p in parts):
        layer, visit, head = (int(p) for p in parts)
        return stat, (layer, visit, head)
    return None


def case_table(records: Iterable[Any]) -> pd.DataFrame:
    """The case study over training from parsed metrics records: one row per (eval step,
    statistic and, for the per-head ones, layer, visit, head) with columns HISTORY_COLUMNS
    (layer, visit and head empty for the accuracies). Anything not an eval record of the main
    run (decay branches are left out) gives no rows."""
    rows: list[dict] = []
    for rec in main_evals(records):
        for key, value in rec.items():
            found = _where(key)
            if found is None or not isinstance(value, (int, float)):
                continue
            stat, at = found
            layer, visit, head = at if at is not None else (None, None, None)
            rows.append(
                {
                    "step": rec.get("step"),
                    "tokens": rec.get("tokens"),
                    "layer": layer,
                    "visit": visit,
                    "head": head,
                    "statistic": stat,
                    "value": float(value),
                }
            )
    table = pd.DataFrame(rows, columns=list(HISTORY_COLUMNS))
    return table.astype({"layer": "Int64", "visit": "Int64", "head": "Int64"})


def case_history(metrics_path: str | Path) -> pd.DataFrame:
    """case_table of a run's metrics.jsonl (a torn last line, a run still writing, is dropped);
    an empty table for a missing file or one without case-study records."""
    path = Path(metrics_path)
    return case_table(read_metrics(path) if path.is_file() else [])
