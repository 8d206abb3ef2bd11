"""The over-seeds summary (measure.seeds) on hand-made figures: counts over the thresholds, the
median and the range by hand; the bootstrap interval of the mean against the exact bootstrap
distribution (every resample of five seeds enumerated); no interval outside [0, 1] for a
two-peaked mass where a t interval leaves it; none from 2 seeds."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from smelt_interp.commands.case_seed_tables import mass_cell
from smelt_interp.measure.intervals import t_interval
from smelt_interp.measure.seeds import MIN_SEEDS, over_seeds, seed_summary, threshold_column

FIVE = [0.02, 0.04, 0.9, 0.35, 0.6]


def exact_bootstrap(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of the mean over every one of n^n equally likely resamples."""
    means = sorted(sum(pick) / len(pick) for pick in itertools.product(values, repeat=len(values)))
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def test_counts_median_and_range_by_hand():
    s = seed_summary(FIVE)
    assert s.n == 5 and s.mean == pytest.approx(1.91 / 5)
    assert s.median == 0.35 and (s.lowest, s.highest) == (0.02, 0.9)
    assert s.above == {0.3: 3, 0.5: 2}  # 0.35, 0.6, 0.9 above 0.3; 0.6, 0.9 above 0.5
    assert seed_summary([0.3, 0.5, 0.51]).above == {0.3: 2, 0.5: 1}  # strictly above
    assert seed_summary([0.1, math.nan, None, 0.7]).n == 2  # missing seeds left out


def test_the_interval_is_the_bootstrap_of_the_mean_over_seeds():
    s = seed_summary(FIVE, n_resamples=20_000)
    lo, hi = exact_bootstrap(FIVE)
    assert s.lo == pytest.approx(lo, abs=0.02) and s.hi == pytest.approx(hi, abs=0.02)
    assert s.lowest <= s.lo < s.mean < s.hi <= s.highest
    assert seed_summary(FIVE) == seed_summary(FIVE)  # seeded


def test_a_two_peaked_mass_keeps_its_interval_inside_zero_one():
    """One seed parks near 1, four stay near 0: the t interval runs below 0, ours does not."""
    parked = [0.01, 0.02, 0.0, 0.97, 0.03]
    assert t_interval(parked)[1] < 0
    s = seed_summary(parked)
    assert 0 <= s.lo <= s.hi <= 1 and s.above == {0.3: 1, 0.5: 1}
    high = [1.0, 0.99, 1.0, 0.62]  # and above 1 on the other side
    assert t_interval(high)[2] > 1
    assert 0 <= seed_summary(high).lo <= seed_summary(high).hi <= 1


def test_no_interval_from_two_seeds():
    assert MIN_SEEDS == 3
    s = seed_summary([0.2, 0.8])
    assert math.isnan(s.lo) and math.isnan(s.hi)
    assert s.mean == 0.5 and s.median == 0.5 and s.above == {0.3: 1, 0.5: 1}
    assert not math.isnan(seed_summary([0.2, 0.8, 0.5]).lo)


def test_over_seeds_columns_and_cells():
    frame = pd.DataFrame(
        {"model": ["a"] * 5 + ["b"] * 2, "x": [*FIVE, 0.2, 0.8]},
    )
    table = over_seeds(frame, ["model"], ["x"]).set_index("model")
    assert table.loc["a", "n_seeds"] == 5 and table.loc["b", "n_seeds"] == 2
    assert table.loc["a", "x_median"] == 0.35 and table.loc["a", "x_max"] == 0.9
    assert table.loc["a", threshold_column("x", 0.3)] == 3
    assert table.loc["a", "x_lo"] == seed_summary(FIVE).lo
    cell = mass_cell(table.loc["b"].to_dict() | {"model": "b"}, "x")
    assert cell == "0.500; 0.500; 0.200 to 0.800; 1 / 1"  # no interval over seeds
    assert mass_cell(table.loc["a"].to_dict(), "x").startswith(f"{1.91 / 5:.3f}; 0.350; ")
