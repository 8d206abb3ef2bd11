"""The count claims' Fisher tests: the p-values by hand (hypergeometric tails), the file they
are written to, and bad counts refused in one line with nothing written."""

from __future__ import annotations

from math import comb

import pytest
from helpers.bad_input import run_command

from smelt_interp.commands.claim_tests import claim_tests_main

MODULE = "smelt_interp.commands.claim_tests"


def fisher_by_hand(a: int, n_a: int, b: int, n_b: int) -> float:
    """P(A's hits >= a) given the margins: the hypergeometric upper tail."""
    total, n = a + b, n_a + n_b
    return sum(comb(n_a, k) * comb(n_b, total - k) for k in range(a, min(n_a, total) + 1)) / comb(
        n, total
    )


def test_p_values_by_hand(tmp_path):
    out = tmp_path / "tests.md"
    argv = ["--results", str(out), "--fisher", "hidden vs visible", "5/5", "2/5"]
    assert claim_tests_main([*argv, "--fisher", "beta2", "3/5", "0/2"]) == 0
    text = out.read_text()
    assert f"| hidden vs visible | 5 of 5 | 2 of 5 | {fisher_by_hand(5, 5, 2, 5):.3f} |" in text
    assert f"| beta2 | 3 of 5 | 0 of 2 | {fisher_by_hand(3, 5, 0, 2):.3f} |" in text
    assert fisher_by_hand(5, 5, 2, 5) == pytest.approx(1 / 12)  # the 0.083
    assert "Command: `python -m smelt_interp.commands.claim_tests" in text


@pytest.mark.parametrize("bad", ["6/5", "a/5", "1/0", "3"])
def test_bad_counts_are_one_line_exit_2(tmp_path, bad):
    out = tmp_path / "tests.md"
    code, _, err = run_command(MODULE, "--results", out, "--fisher", "x", bad, "1/5")
    assert code == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert not out.exists()
