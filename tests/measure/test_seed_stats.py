"""The seed statistics against hand counts and simulation: the exact sign and sign-flip tests
by enumeration, Fisher's exact test at the issue's counts, the difference in differences by
hand, and the percentile bootstrap's coverage over 3 and 5 seeds (far under its nominal 95%)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from smelt_interp.measure.seed_stats import (
    bootstrap_coverage,
    diff_in_diff,
    fisher_greater,
    sign_flip_test,
    sign_test,
)


def test_sign_test_by_hand():
    assert sign_test([-0.2, -0.3, -0.05, -0.1, -0.4]) == pytest.approx(2 / 32)
    assert sign_test([-0.2, -0.3, -0.05, -0.1]) == pytest.approx(2 / 16)
    # 4 of 5 negative: P(X <= 1) + P(X >= 4) for X ~ Bin(5, 1/2) = 12 / 32
    assert sign_test([-0.2, -0.3, 0.05, -0.1, -0.4]) == pytest.approx(12 / 32)
    assert sign_test([0.0, -0.1, float("nan")]) == 1.0  # one difference left: p = 1
    assert sign_test([]) == 1.0


def test_sign_flip_test_by_enumeration():
    x = np.array([0.3, -0.1, 0.25, 0.4])
    means = [abs(np.mean(np.array(s) * x)) for s in itertools.product((1, -1), repeat=4)]
    expected = np.mean([m >= abs(x.mean()) - 1e-12 for m in means])
    assert sign_flip_test(x) == pytest.approx(expected)
    assert sign_flip_test([-0.2, -0.3, -0.05, -0.1, -0.4]) == pytest.approx(2 / 32)


def test_fisher_at_the_issue_counts():
    assert fisher_greater(5, 5, 2, 5) == pytest.approx(1 / 12)  # 0.083
    assert fisher_greater(3, 5, 0, 2) == pytest.approx(2 / 7)  # 0.29


def test_diff_in_diff_by_hand():
    schedule = [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (3, 0)]
    smelt = {(0, 0): 0.1, (1, 0): 0.9, (2, 0): 0.8, (1, 1): 0.7, (2, 1): 0.5, (3, 0): 0.4}
    base = {0: 0.1, 1: 0.85, 2: 0.5, 3: 0.55}
    # layer 1 runs at depths 1 and 3: (0.7 - 0.9) - (0.55 - 0.85) = -0.2 + 0.3
    assert diff_in_diff(smelt, schedule, base, 1) == pytest.approx(0.1)
    # layer 2's second visit runs at depth 4, deeper than any Baseline layer
    assert math.isnan(diff_in_diff(smelt, schedule, base, 2))


@pytest.mark.parametrize(("n_seeds", "low", "high"), [(3, 0.62, 0.84), (5, 0.75, 0.93)])
def test_a_percentile_bootstrap_over_few_seeds_is_not_95(n_seeds, low, high):
    """Normal seeds: a nominal 95% percentile bootstrap of the mean covers about 73% at 3 seeds
    and 85% at 5 (400 simulated experiments, standard error about 0.02)."""

    def draw(rng, n):
        return rng.normal(0.5, 0.1, n)

    cover = bootstrap_coverage(n_seeds, draw, 0.5, n_sim=400, n_resamples=200)
    assert low < cover < high < 0.95
