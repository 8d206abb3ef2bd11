"""Linear probes (measure.linear_probe): a feature planted into one visit's output is read at
every later residual and at no earlier one, each beside its shuffled-label control; the score,
the control and the majority level on a hand-made case."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smelt_interp.errors import DataError
from smelt_interp.measure.linear_probe import fit_score, probe_table
from smelt_interp.model.protocol import hook_name

PLANT = (2, 0)  # the visit whose output carries the planted feature


def test_a_separable_feature_scores_one_and_its_control_does_not():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    x = rng.normal(size=(400, 5))
    x[:, 0] += 4.0 * (2 * y - 1)  # the label, read along one axis
    score = fit_score(x[:200], y[:200], x[200:], y[200:], seed=1)
    assert score.accuracy == 1.0
    assert score.control < 0.7
    values, counts = np.unique(y[:200], return_counts=True)
    assert score.majority == pytest.approx(np.mean(y[200:] == values[counts.argmax()]))
    assert (score.n_train, score.n_test, score.n_labels) == (200, 200, 2)


def test_one_label_or_no_held_out_positions_is_an_error():
    x = np.zeros((4, 2))
    with pytest.raises(DataError, match="at least 2 labels"):
        fit_score(x, np.zeros(4), x, np.zeros(4))
    with pytest.raises(DataError, match="held-out"):
        fit_score(x, np.array([0, 1, 0, 1]), x[:0], np.zeros(0))


def test_a_planted_feature_is_found_after_its_visit_and_not_before(make_cfg, make_model):
    """Random labels, independent of the tokens, are added along one direction per label to
    the output of visit PLANT: every residual after it reads them (accuracy > 0.9, the
    shuffled-label control near chance), every one before it does not (< 0.45, chance 0.25)."""
    model = make_model(make_cfg(looped=True, max_seq_len=64), seed=2)
    schedule = list(model.schedule)
    assert schedule == [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (3, 0)]
    gen = torch.Generator().manual_seed(3)
    rows, length, n_labels = 8, 32, 4
    where = torch.ones(rows, length, dtype=torch.bool)
    where[:, 0] = False  # BOS carries no label
    sets = []
    for _ in range(2):  # the training rows, then the held-out rows
        tokens = torch.randint(0, 256, (rows, length), generator=gen)
        tokens[:, 0] = model.cfg.bos_token_id
        sets.append((tokens, where, torch.randint(0, n_labels, (rows, length), generator=gen)))
    directions = torch.randn(n_labels, model.cfg.d_model, generator=gen)
    # probe_table runs the training rows, then the held-out rows, one batch each: the hook
    # plants each set's labels on its own pass (in another order, the later visits would fail)
    planted = [labels for _, _, labels in sets]

    def plant(act, hook):
        return act + 3.0 * directions[planted.pop(0)]

    with model.hooks(fwd_hooks=[(hook_name(*PLANT, "hook_resid_post"), plant)]):
        table = probe_table(
            model,
            *[(tokens, w, labels[w].numpy()) for tokens, w, labels in sets],
            batch_size=rows,
        )
    assert planted == []
    assert list(zip(table["layer"], table["visit"])) == [*schedule, schedule[-1]]
    assert list(table["hook"]) == ["resid_pre"] * len(schedule) + ["resid_post"]
    after = table["depth"] > schedule.index(PLANT)
    assert (table.loc[after, "accuracy"] > 0.9).all(), table
    assert (table.loc[after, "control"] < 0.45).all(), table
    assert (table.loc[~after, "accuracy"] < 0.45).all(), table
    assert (table["n_labels"] == n_labels).all() and (table["n_test"] == rows * (length - 1)).all()
