"""The real model's results page (commands.real_lm_results) from measurements given here: each
looped visit's change from visit 0 beside the unlooped model's change between the layers at the
same depths, worked by hand, the loss change, and '–' past the last layer."""

from __future__ import annotations

from smelt_interp.commands.real_lm_results import headline_rows, visit_rows


def records(values: dict[tuple[int, int], float], field: str) -> list[dict]:
    return [{"layer": lay, "visit": v, "depth": 0, field: x} for (lay, v), x in values.items()]


def run(label: str, bos: dict, demo: dict, code: dict, loss: float) -> dict:
    answers = [
        {**b, "demo_mean": demo[(b["layer"], b["visit"])], "bos_uniform": 0.1}
        for b in records(bos, "bos_mean")
    ]
    accuracy = [{"n_demos": n, "n": 1, "accuracy": 0.5, "kind": k}
                for k in ("exact_match", "teacher_forced") for n in (0, 1, 2, 4)]  # fmt: skip
    return {
        "label": label, "answer_visits": answers, "code_visits": records(code, "first_mass"),
        "accuracy": accuracy, "loss": loss, "code_first_mass": 0.4, "code_sink03": 0.7,
    }  # fmt: skip


def test_each_visit_is_set_beside_the_unlooped_change_at_matched_depth() -> None:
    layers = range(4)
    base_bos = {(n, 0): 0.1 * (n + 1) for n in layers}  # 0.1, 0.2, 0.3, 0.4
    base = run("unlooped", base_bos, {(n, 0): 0.0 for n in layers}, base_bos, 2.0)
    # loop 1:3x2: layer 1 visit 1 runs at depth 3, layer 2 visit 1 at depth 4 (past the last)
    looped_bos = {(0, 0): 0.1, (1, 0): 0.2, (2, 0): 0.3, (3, 0): 0.4, (1, 1): 0.5, (2, 1): 0.05}
    looped = run("1:3x2", looped_bos, dict.fromkeys(looped_bos, 0.0), looped_bos, 2.25)
    data = {"spans": [[1, 3, 2]], "runs": [base, looped]}
    rows = {(r[1], r[2]): r for r in visit_rows(data)}
    assert (
        rows[("1", "1")][3] == "3" and rows[("1", "1")][5] == "+0.300 / +0.200"
    )  # 0.5-0.2, 0.4-0.2
    assert rows[("2", "1")][3] == "4" and rows[("2", "1")][5] == "-0.250 / –"
    assert rows[("1", "0")][5] == ""
    head = headline_rows(data)
    assert head[1][1] == "2.250 (+0.250)" and head[1][4] == "0.250 to 0.275"  # (0.2+0.3)/2 ...
    assert head[0][6] == "50%, 50%, 50%, 50%; 50%, 50%, 50%, 50%"


def test_the_reading_is_generated_from_the_tables() -> None:
    from smelt_interp.commands.real_lm_results import reading, span_changes

    base_bos = {(n, 0): 0.1 * (n + 1) for n in range(4)}
    base = run("unlooped", base_bos, dict.fromkeys(base_bos, 0.0), base_bos, 2.0)
    bos = {**base_bos, (1, 1): 0.5, (2, 1): 0.05}
    data = {
        "spans": [[1, 3, 2]],
        "runs": [base, run("1:3x2", bos, dict.fromkeys(bos, 0.0), bos, 2.5)],
    }
    ((label, change, own),) = span_changes(data, "bos_mean")
    assert label == "1:3x2" and abs(change - (0.3 - 0.25) / 2) < 1e-12  # (+0.3, -0.25) / 2
    assert abs(own - 0.2) < 1e-12  # only layer 1's depth 3 lies within the unlooped model
    text = reading(data)
    assert "1:3x2 +0.500 nats" in text and "1:3x2 +0.025 (unlooped, same depths: +0.200)" in text
