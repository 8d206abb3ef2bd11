"""Linear probes of a named feature per (layer, visit) (measure.linear_probe): how well a
logistic regression reads the feature from each visit's input residual and from the last
output, beside a shuffled-label control and the majority level.

Features (FEATURES), each read at its own positions of computed-class recall rows
(data.computed_recall), under the checkpoint's spec (probes.computed_inputs):

    class   the class c of the triple before each `=` (deep key: f2(f1(x, y), z)), read at every
            `=` of the rows (demonstrations and query), where the answer must be looked up by it

The probe is fit on held-out rows of seed namespace "probe-fit:{seed}" and scored on held-out
rows of "probe-score:{seed}" (inputs.n_seqs rows each), so no scored position was fit. "Read at
visit 1, not at visit 0" of a looped layer says the first visit computed it. Table `probes`:
measure.linear_probe.COLUMNS with the feature first. Any model with per-visit hook_resid_pre
(SmeltModel and the transformers adapters) whose tokens are bytes.

    python -m smelt_interp.probes.linear_probe ckpt.pt [--n-seqs N] [--seed S] [--json OUT]

The report runs it; the dashboard leaves it to the report (app.pages.REPORT_ONLY), since it fits
2 x (visits + 1) logistic regressions.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from smelt_interp.data.computed_recall import ComputedRecallSpec, computed_positions
from smelt_interp.errors import DataError, ProbeError
from smelt_interp.measure.batching import DEFAULT_BATCH
from smelt_interp.measure.linear_probe import COLUMNS, probe_table
from smelt_interp.model.protocol import LoopedModel
from smelt_interp.probes.common import loop_span
from smelt_interp.probes.computed_inputs import probe_rows
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary

FIT, SCORE = "probe-fit", "probe-score"  # the two held-out seed namespaces
TABLE_COLUMNS = ("feature", *COLUMNS)

# feature -> (rows [b, T], spec) -> (where [b, T] bool, labels [n] at those positions, row order)
Feature = Callable[[torch.Tensor, ComputedRecallSpec], tuple[torch.Tensor, np.ndarray]]


def class_feature(
    tokens: torch.Tensor, spec: ComputedRecallSpec
) -> tuple[torch.Tensor, np.ndarray]:
    """The class of the triple before each `=` of the rows, at those `=` positions."""
    classes = computed_positions(tokens, spec).classes
    where = classes >= 0
    return where, classes[where].numpy()


FEATURES: dict[str, Feature] = {"class": class_feature}


def feature_table(
    model: LoopedModel,
    fit: torch.Tensor,
    score: torch.Tensor,
    spec: ComputedRecallSpec,
    feature: str = "class",
    *,
    batch_size: int = DEFAULT_BATCH,
    seed: int = 0,
) -> pd.DataFrame:
    """The linear probe of `feature` fit on rows `fit` and scored on rows `score` (computed-recall
    rows of `spec`): one row per visit input and the last output (TABLE_COLUMNS)."""
    if feature not in FEATURES:
        raise ProbeError(f"unknown feature {feature!r}; the features are {', '.join(FEATURES)}")
    read = FEATURES[feature]
    train = (fit, *read(fit, spec))
    test = (score, *read(score, spec))
    try:
        table = probe_table(model, train, test, batch_size=batch_size, seed=seed)
    except DataError as exc:  # too few rows to hold two labels: a probe that cannot be fit here
        raise ProbeError(
            f"the {feature} probe cannot be fit: {exc}; give more rows (--n-seqs)"
        ) from None
    table.insert(0, "feature", feature)
    return table


def run(model: LoopedModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    """The class probe on inputs.n_seqs fit rows and as many scored rows."""
    fit, spec = probe_rows(model, inputs, FIT)
    score, _ = probe_rows(model, inputs, SCORE)
    table = feature_table(model, fit, score, spec, batch_size=opts.batch_size, seed=inputs.seed)
    return {"probes": table}


def summarize(tables: Tables) -> pd.DataFrame:
    """Accuracy beside its control at the inputs of the first looped layer's visits 0 and 1 (a
    Baseline: the layer the recipe would loop first, visit 0 only) and at the last output."""
    table = tables["probes"]
    feature = str(table["feature"].iloc[0])
    inputs = table[table["hook"] == "resid_pre"]
    first = loop_span(inputs)[0]
    rows = []
    for visit in (0, 1):
        at = inputs[(inputs["layer"] == first) & (inputs["visit"] == visit)]
        if not at.empty:
            where = f"input of layer {first} visit {visit}"
            rows.append((f"{feature} accuracy, {where}", float(at["accuracy"].iloc[0]), ""))
            rows.append((f"{feature} control, {where}", float(at["control"].iloc[0]), ""))
    last = table[table["hook"] == "resid_post"].iloc[-1]
    rows.append((f"{feature} accuracy, last output", float(last["accuracy"]), ""))
    rows.append((f"{feature} control, last output", float(last["control"]), ""))
    rows.append((f"{feature} majority level", float(last["majority"]), ""))
    return summary(rows)


PROBE = ProbeSpec(
    "linear_probe",
    "Linear probe of the computed-recall class at each visit's input and the last output: "
    "held-out accuracy beside a shuffled-label control and the majority level.",
    run,
    summarize,
    tables=("probes",),
    figures=(
        FigureSpec("by_depth", "probes", "Linear probe of the class: accuracy", y="accuracy"),
    ),
)


if __name__ == "__main__":
    from smelt_interp.probes.cli import run_probe_command

    run_probe_command(PROBE)
