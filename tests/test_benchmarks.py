"""The benchmarks' measuring rules, on a fake clock: warm-up first, then rounds in which the
trainers take turns, and the per-round ratio range against ratios worked by hand."""

from __future__ import annotations

import pytest

from benchmarks.train_bench import interleaved_rounds, interleaved_seconds, round_ratio_range


class FakeClock:
    """A timer that logs which trainer ran how many steps and answers from a script."""

    def __init__(self, seconds: dict[str, list[float]]) -> None:
        self.seconds = {key: list(values) for key, values in seconds.items()}
        self.calls: list[tuple[str, int]] = []

    def __call__(self, trainer: str, steps: int) -> float:
        self.calls.append((trainer, steps))
        return self.seconds[trainer].pop(0)


def test_rounds_interleave_after_one_warm_up_step_each() -> None:
    clock = FakeClock({"a": [9.0, 1.0, 3.0, 2.0], "b": [8.0, 4.0, 6.0, 5.0]})
    warmup, times = interleaved_rounds({"a": "a", "b": "b"}, steps=5, rounds=3, timer=clock)
    assert clock.calls == [("a", 1), ("b", 1)] + [("a", 5), ("b", 5)] * 3
    assert warmup == {"a": 9.0, "b": 8.0}
    assert times == {"a": [1.0, 3.0, 2.0], "b": [4.0, 6.0, 5.0]}


def test_interleaved_seconds_is_the_median_round() -> None:
    clock = FakeClock({"a": [9.0, 1.0, 3.0, 2.0], "b": [8.0, 4.0, 6.0, 5.0]})
    _, median = interleaved_seconds({"a": "a", "b": "b"}, steps=5, rounds=3, timer=clock)
    assert median == {"a": 2.0, "b": 5.0}


def test_round_ratio_range_pairs_rounds_not_sorted_values() -> None:
    # rates of two trainers over three rounds: 8/10, 4/8, 9/9
    smelt, baseline = [8.0, 4.0, 9.0], [10.0, 8.0, 9.0]
    assert round_ratio_range(smelt, baseline) == (0.5, 1.0)
    # pairing by rank instead of by round would read 4/8, 8/9, 9/10: a narrower range
    assert round_ratio_range(sorted(smelt), sorted(baseline)) == (0.5, 0.9)
    with pytest.raises(ValueError):
        round_ratio_range([1.0], [1.0, 2.0])


def test_load_ratios_divide_the_other_checkouts_p95_by_this_ones() -> None:
    from benchmarks.load_bench import percentile, ratios

    def result(**p95: float) -> dict:
        return {"groups": [{"group": g, "n": 1, "p95_s": v} for g, v in p95.items()]}

    other = result(all=3.0, page=1.0, gone=2.0)
    this = result(all=1.5, page=2.0, new=1.0)
    assert ratios(other, this) == {"all": 2.0, "page": 0.5}  # only groups both measured
    assert percentile([5.0, 1.0, 4.0, 2.0, 3.0], 0.5) == 3.0
    assert percentile(list(map(float, range(1, 101))), 0.95) == 95.0
