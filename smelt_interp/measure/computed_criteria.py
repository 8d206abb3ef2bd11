"""The pre-registered success criteria of the computed-class recall seed study, as arithmetic on
per-seed values: the thresholds, each seed's checks, the verdict over seeds, the summaries over
seeds, the difference in differences against the Baseline at matched depth and the sign test.

The criteria, their thresholds and the verdict's rule are those of the results file
docs/results/computed_recall.md ("Pre-registered success criteria"), which was committed before
any test seed was trained. Every threshold the study judges by is a constant below, named after
the criterion it belongs to; none of them may change after a test seed is seen (the file says
so). What the file words as "at least t" is `value >= t`, "at most t" is `value <= t`, each up to
TOLERANCE, so that a rate of k / n on the threshold is not lost to float rounding (0.45 <= 0.35 +
0.10 is False in floats). A NaN value meets no check.

Per seed (one row of a per-seed table, the columns of JUDGED):

1. `answer_acc` (deep-key SMELT, answer positions of the test rows) >= ACCURACY_MIN, and
   `shuffled_acc` (the same on shuffled-label rows) <= SHUFFLED_MAX;
2. `probe_v0_acc` (class probe at the input of the first looped layer's visit 0) <= PROBE_V0_MAX
   or <= `probe_v0_control` + PROBE_V0_OVER_CONTROL; `probe_v1_acc` >= PROBE_V1_MIN;
3. the tracked head of the deep-key SMELT: `bos_v0` >= BOS_V0_MIN, `demo_v1` >= DEMO_V1_MIN,
   `bos_v1` <= BOS_V1_MAX;
4. the tracked head of the shallow-key SMELT: `shallow_demo_v0` >= SHALLOW_DEMO_V0_MIN.

Success: all four on at least SEEDS_NEEDED of the N_TEST_SEEDS test seeds (TEST_SEEDS), measured
on TEST_ROWS rows; a run on other seeds, other row counts or labelled a validation run gets the
count but no verdict.

Matched depth (`matched_depths`, `matched_depth_did`): SMELT's (layer L, visit v) runs at depth
index d, its position in SMELT's schedule; the Baseline's layer at the same depth index d (a
Baseline runs layer d at depth d) is its match. The difference in differences is then (SMELT
(L, 1) - (L, 0)) - (Baseline layer d1 - layer d0), measure.seed_stats.diff_in_diff; NaN where the
Baseline has no layer at d1 or d0."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from smelt_interp.measure.seed_stats import diff_in_diff, effective_depths, sign_test
from smelt_interp.measure.seeds import seed_summary

CRITERIA_FILE = "docs/results/computed_recall.md"  # where the criteria below are worded

# ----- the pre-registered design -------------------------------------------------------------
VALIDATION_SEEDS = range(0, 5)  # the recipe is chosen on these
TEST_SEEDS = range(5, 10)  # the study's test seeds
N_TEST_SEEDS = len(TEST_SEEDS)
SEEDS_NEEDED = 4  # of the N_TEST_SEEDS, that meet every criterion
TEST_ROWS = 512  # answer accuracy (and every judged figure) on this many test rows

# ----- the thresholds, by criterion ----------------------------------------------------------
ACCURACY_MIN = 0.90  # 1: deep-key SMELT answer accuracy at least
SHUFFLED_MAX = 0.30  # 1: its answer accuracy on shuffled-label rows at most
PROBE_V0_MAX = 0.40  # 2: class probe at visit 0 near chance: accuracy at most ...
PROBE_V0_OVER_CONTROL = 0.10  # 2: ... or at most its shuffled-label control + this
PROBE_V1_MIN = 0.80  # 2: class probe at visit 1 at least
BOS_V0_MIN = 0.5  # 3: tracked head's BOS mass at visit 0 at least
DEMO_V1_MIN = 0.5  # 3: its matching-demonstration mass at visit 1 at least
BOS_V1_MAX = 0.1  # 3: its BOS mass at visit 1 at most
SHALLOW_DEMO_V0_MIN = 0.5  # 4: shallow-key tracked head's matching-demonstration mass at visit 0

TOLERANCE = 1e-9  # "at least" / "at most" up to float rounding

# the per-seed values the criteria read
JUDGED = (
    "answer_acc",
    "shuffled_acc",
    "probe_v0_acc",
    "probe_v0_control",
    "probe_v1_acc",
    "bos_v0",
    "demo_v1",
    "bos_v1",
    "shallow_demo_v0",
)


def at_least(value: float, threshold: float) -> bool:
    return not math.isnan(value) and value >= threshold - TOLERANCE


def at_most(value: float, threshold: float) -> bool:
    return not math.isnan(value) and value <= threshold + TOLERANCE


@dataclass(frozen=True)
class Check:
    """One check of a criterion: its column in the judged table, the criterion (1-4) it is part
    of, its wording, and the test on a seed's values."""

    column: str
    criterion: int
    text: str
    test: Callable[[Mapping[str, float]], bool]


CHECKS = (
    Check(
        "c1_accuracy",
        1,
        f"deep-key SMELT answer accuracy >= {ACCURACY_MIN:g}",
        lambda v: at_least(v["answer_acc"], ACCURACY_MIN),
    ),
    Check(
        "c1_shuffled",
        1,
        f"its answer accuracy on shuffled-label rows <= {SHUFFLED_MAX:g}",
        lambda v: at_most(v["shuffled_acc"], SHUFFLED_MAX),
    ),
    Check(
        "c2_probe_v0",
        2,
        f"class probe at visit 0 <= {PROBE_V0_MAX:g} or <= control + {PROBE_V0_OVER_CONTROL:g}",
        lambda v: (
            at_most(v["probe_v0_acc"], PROBE_V0_MAX)
            or at_most(v["probe_v0_acc"], v["probe_v0_control"] + PROBE_V0_OVER_CONTROL)
        ),
    ),
    Check(
        "c2_probe_v1",
        2,
        f"class probe at visit 1 >= {PROBE_V1_MIN:g}",
        lambda v: at_least(v["probe_v1_acc"], PROBE_V1_MIN),
    ),
    Check(
        "c3_bos_v0",
        3,
        f"tracked head's BOS mass at visit 0 >= {BOS_V0_MIN:g}",
        lambda v: at_least(v["bos_v0"], BOS_V0_MIN),
    ),
    Check(
        "c3_demo_v1",
        3,
        f"tracked head's matching-demonstration mass at visit 1 >= {DEMO_V1_MIN:g}",
        lambda v: at_least(v["demo_v1"], DEMO_V1_MIN),
    ),
    Check(
        "c3_bos_v1",
        3,
        f"tracked head's BOS mass at visit 1 <= {BOS_V1_MAX:g}",
        lambda v: at_most(v["bos_v1"], BOS_V1_MAX),
    ),
    Check(
        "c4_shallow_demo_v0",
        4,
        f"shallow-key tracked head's matching-demonstration mass at visit 0 >= "
        f"{SHALLOW_DEMO_V0_MIN:g}",
        lambda v: at_least(v["shallow_demo_v0"], SHALLOW_DEMO_V0_MIN),
    ),
)
CRITERIA = (1, 2, 3, 4)
CRITERION_COLUMNS = tuple(f"criterion_{c}" for c in CRITERIA)
ALL_MET = "all_met"


def judge(per_seed: pd.DataFrame) -> pd.DataFrame:
    """`per_seed` (one row per seed, the JUDGED columns) with a bool column per check (CHECKS),
    per criterion (criterion_1 .. criterion_4: all its checks) and ALL_MET (every criterion)."""
    missing = [c for c in JUDGED if c not in per_seed]
    if missing:
        raise KeyError(f"the per-seed table lacks {', '.join(missing)}")
    out = per_seed.copy()
    records = out[list(JUDGED)].astype(float).to_dict("records")
    for check in CHECKS:
        out[check.column] = [bool(check.test(values)) for values in records]
    for criterion, column in zip(CRITERIA, CRITERION_COLUMNS):
        parts = [check.column for check in CHECKS if check.criterion == criterion]
        out[column] = out[parts].all(axis=1)
    out[ALL_MET] = out[list(CRITERION_COLUMNS)].all(axis=1)
    return out


@dataclass(frozen=True)
class Verdict:
    """The study's verdict: `n_met` of `n_seeds` seeds meet every criterion; `preregistered`
    (the run is the pre-registered test: TEST_SEEDS, TEST_ROWS rows, not a validation run) and
    `success` (None when not preregistered); `reasons` why it is not the test; `text`, one
    sentence."""

    n_seeds: int
    n_met: int
    preregistered: bool
    success: bool | None
    reasons: tuple[str, ...]
    text: str


def verdict(
    judged: pd.DataFrame, seeds: Sequence[int], n_rows: int, validation: bool = False
) -> Verdict:
    """The verdict over seeds of a judged table (judge): success when at least SEEDS_NEEDED of
    the N_TEST_SEEDS test seeds meet every criterion; no verdict for another design."""
    n_seeds, n_met = len(judged), int(judged[ALL_MET].sum())
    reasons = []
    if validation:
        reasons.append("a validation run")
    if sorted(seeds) != list(TEST_SEEDS):
        reasons.append(f"seeds {seed_text(seeds)}, not the test seeds {seed_text(TEST_SEEDS)}")
    if n_rows != TEST_ROWS:
        reasons.append(f"{n_rows} row{'' if n_rows == 1 else 's'}, not {TEST_ROWS}")
    count = f"{n_met} of {n_seeds} seeds meet all four criteria"
    if reasons:
        rule = "met" if n_met >= SEEDS_NEEDED else "not met"
        text = (
            f"No verdict: not the pre-registered test ({'; '.join(reasons)}). {count} (the rule, "
            f"at least {SEEDS_NEEDED} of {N_TEST_SEEDS}, would read: {rule})."
        )
        return Verdict(n_seeds, n_met, False, None, tuple(reasons), text)
    success = n_met >= SEEDS_NEEDED
    head = "Success" if success else "Not met"
    text = f"{head}: {count} (needed: at least {SEEDS_NEEDED} of {N_TEST_SEEDS})."
    return Verdict(n_seeds, n_met, True, success, (), text)


def seed_text(seeds: Sequence[int] | range) -> str:
    """Seeds as ranges: [5, 6, 7, 9] -> '5-7, 9'."""
    values = sorted(set(seeds))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(parts)


def summaries(per_seed: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """One row per column of `per_seed`: statistic, n (seeds with a value), median, lowest,
    highest and mean over seeds (measure.seeds.seed_summary)."""
    rows = []
    for col in columns:
        s = seed_summary(per_seed[col].astype(float).tolist())
        rows.append(
            {
                "statistic": col,
                "n": s.n,
                "median": s.median,
                "lowest": s.lowest,
                "highest": s.highest,
                "mean": s.mean,
            }
        )
    return pd.DataFrame(rows)


def matched_depths(smelt_schedule: Sequence[tuple[int, int]], layer: int) -> tuple[int, int]:
    """(d0, d1): the depth indices of SMELT's (layer, 0) and (layer, 1) in its schedule, which
    are the Baseline layers they are matched with."""
    depth = effective_depths(smelt_schedule)
    return depth[layer, 0], depth[layer, 1]


def matched_depth_did(
    smelt: Mapping[tuple[int, int], float],
    smelt_schedule: Sequence[tuple[int, int]],
    baseline: Mapping[int, float],
    layer: int,
) -> dict[str, Any]:
    """One seed's difference in differences of one statistic at SMELT's `layer`: SMELT's values
    per (layer, visit), the Baseline's per layer. The record: the depths d0 and d1, SMELT's
    visits and change, the Baseline's layers d0 and d1 and change, and `did` (NaN where the
    Baseline has no layer at d0 or d1)."""
    d0, d1 = matched_depths(smelt_schedule, layer)
    base_0, base_1 = baseline.get(d0, math.nan), baseline.get(d1, math.nan)
    return {
        "layer": layer,
        "d0": d0,
        "d1": d1,
        "smelt_v0": smelt[layer, 0],
        "smelt_v1": smelt[layer, 1],
        "smelt_change": smelt[layer, 1] - smelt[layer, 0],
        "baseline_d0": base_0,
        "baseline_d1": base_1,
        "baseline_change": base_1 - base_0,
        "did": diff_in_diff(smelt, smelt_schedule, baseline, layer),
    }


@dataclass(frozen=True)
class SignTest:
    """The exact two-sided sign test of the per-seed differences `diffs`: its p-value, the
    seeds above and below zero, and `floor`, the smallest p-value the seeds can give (2 x
    0.5^n, 0.0625 at 5 seeds: a consistent direction, never significance at 0.05)."""

    diffs: tuple[float, ...]
    positive: int
    negative: int
    p_value: float
    floor: float


def bos_sign_test(per_seed: pd.DataFrame) -> SignTest:
    """The sign test over seeds of the tracked head's BOS mass at visit 0 minus visit 1."""
    diffs = (per_seed["bos_v0"].astype(float) - per_seed["bos_v1"].astype(float)).tolist()
    usable = [d for d in diffs if not math.isnan(d) and d != 0]
    floor = min(1.0, 2 * 0.5 ** len(usable)) if usable else 1.0
    positive = sum(d > 0 for d in usable)
    return SignTest(tuple(diffs), positive, len(usable) - positive, sign_test(diffs), floor)
