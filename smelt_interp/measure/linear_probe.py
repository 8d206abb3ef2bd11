"""Linear probes: how well a logistic regression reads a feature of each position from the
residual stream at one (layer, visit), fit on training rows and scored on held-out rows.

Beside each score stand two levels it must beat: the same fit on shuffled training labels (the
control: what a probe of this capacity reads from these residuals when the feature carries no
information about them), and the held-out share of the most common training label (what a
constant guess scores). A feature is read at a visit when the accuracy clears both.

The residual probed at (layer, visit) is that visit's input (`hook_resid_pre`): what the visit
has to work with, so "near chance at the input of visit 0 and high at visit 1" says the first
visit computed it. The last visit's output (`hook_resid_post`) closes the table, as depth
len(schedule). Features are standardised, then fit by scikit-learn's multinomial logistic
regression (L2, C = 1, lbfgs)."""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields

import numpy as np
import pandas as pd
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from smelt_interp.errors import DataError
from smelt_interp.measure.batching import DEFAULT_BATCH, capture
from smelt_interp.model.protocol import LoopedModel, hook_name

MAX_ITER = 2000


@dataclass(frozen=True)
class ProbeScore:
    """A linear probe's held-out accuracy, its shuffled-label control's and the majority level."""

    accuracy: float
    control: float
    majority: float
    n_train: int
    n_test: int
    n_labels: int


# probe_table's columns: where the residual was read, then a ProbeScore's fields in order
COLUMNS = ("layer", "visit", "depth", "hook", *(f.name for f in fields(ProbeScore)))


def _fit(x: np.ndarray, y: np.ndarray, seed: int):
    model = make_pipeline(
        StandardScaler(), LogisticRegression(max_iter=MAX_ITER, random_state=seed)
    )
    return model.fit(x, y)


def fit_score(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    *,
    seed: int = 0,
) -> ProbeScore:
    """Fit on (train_x [n, d], train_y [n]) and score on the test set, with the shuffled-label
    control (train_y permuted with `seed`) and the majority level."""
    labels = np.unique(train_y)
    if len(labels) < 2:
        raise DataError(
            f"a linear probe needs at least 2 labels in its training rows, got {len(labels)}"
        )
    if len(test_y) == 0:
        raise DataError("a linear probe needs held-out positions to score on")
    shuffled = np.random.default_rng(seed).permutation(train_y)
    accuracy = float((_fit(train_x, train_y, seed).predict(test_x) == test_y).mean())
    control = float((_fit(train_x, shuffled, seed).predict(test_x) == test_y).mean())
    values, counts = np.unique(train_y, return_counts=True)
    majority = float((test_y == values[counts.argmax()]).mean())
    return ProbeScore(accuracy, control, majority, len(train_y), len(test_y), len(labels))


def visit_features(
    model: LoopedModel,
    tokens: torch.Tensor,
    where: torch.Tensor,
    *,
    batch_size: int = DEFAULT_BATCH,
) -> dict[tuple[int, int, str], np.ndarray]:
    """{(layer, visit, hook): [n, d_model] float64} the residual at the positions `where`
    [b, T] marks, row by row in order: every visit's hook_resid_pre, and hook_resid_post of
    the last visit of the schedule."""
    schedule = list(model.schedule)
    sites = [(layer, visit, "hook_resid_pre") for layer, visit in schedule]
    sites.append((*schedule[-1], "hook_resid_post"))
    names = {site: hook_name(*site) for site in sites}
    parts: dict[tuple[int, int, str], list[np.ndarray]] = {site: [] for site in sites}
    for start in range(0, tokens.shape[0], batch_size):
        rows = slice(start, start + batch_size)
        _, cache = capture(model, tokens[rows], names.values())
        for site, name in names.items():
            parts[site].append(cache[name][where[rows]].double().cpu().numpy())
    return {site: np.concatenate(found) for site, found in parts.items()}


def probe_table(
    model: LoopedModel,
    train: tuple[torch.Tensor, torch.Tensor, np.ndarray],
    test: tuple[torch.Tensor, torch.Tensor, np.ndarray],
    *,
    batch_size: int = DEFAULT_BATCH,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per probed residual (COLUMNS): the linear probe of a feature fit on `train` and
    scored on `test`, each (tokens [b, T], where [b, T] bool, labels [n]: the feature at the
    marked positions, row by row)."""
    fitted = visit_features(model, train[0], train[1], batch_size=batch_size)
    held = visit_features(model, test[0], test[1], batch_size=batch_size)
    rows = []
    for depth, (site, x) in enumerate(fitted.items()):
        score = fit_score(x, train[2], held[site], test[2], seed=seed)
        layer, visit, hook = site
        rows.append((layer, visit, depth, hook.removeprefix("hook_"), *astuple(score)))
    return pd.DataFrame(rows, columns=list(COLUMNS))
