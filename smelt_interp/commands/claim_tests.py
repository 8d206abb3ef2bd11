"""The exact tests behind the results' count claims ("held a sink in 5 of 5 against 3 of 5"):
each named comparison's one-sided Fisher exact p-value (measure.seed_stats.fisher_greater),
written as a results file so the pages quote p-values a command computed.

    python -m smelt_interp.commands.claim_tests --results docs/results/claim_tests.md \\
        --fisher "hidden trigger keys vs visible, validation seeds" 5/5 3/5 [--fisher ...]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from smelt_interp.cli import ArgumentParser, run_cli
from smelt_interp.errors import ConfigError
from smelt_interp.files import atomic_write_text
from smelt_interp.measure.seed_stats import fisher_greater
from smelt_interp.results import command_line, markdown_table, results_text, table_block


def count(text: str) -> tuple[int, int]:
    """(hits, n) of "HITS/N", refused (ConfigError) unless 0 <= hits <= n and n >= 1."""
    hits, _, n = text.partition("/")
    if not (hits.isdigit() and n.isdigit()) or not 0 <= int(hits) <= int(n) or int(n) < 1:
        raise ConfigError(f"a count is HITS/N with 0 <= HITS <= N and N >= 1, got {text!r}")
    return int(hits), int(n)


def parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, required=True, help="the .md file to write")
    p.add_argument(
        "--fisher",
        nargs=3,
        action="append",
        default=[],
        metavar=("CLAIM", "A", "B"),
        help="a claim and its two counts HITS/N, group A claimed higher (repeatable)",
    )
    return p


def claim_tests_main(argv: Sequence[str] | None = None) -> int:
    argv = list(argv) if argv is not None else sys.argv[1:]
    args = parser().parse_args(argv)
    if args.results.suffix != ".md" or not args.fisher:
        raise ConfigError("--results names a .md file and at least one --fisher is given")
    lines = []
    for claim, a, b in args.fisher:
        (hits_a, n_a), (hits_b, n_b) = count(a), count(b)
        p = fisher_greater(hits_a, n_a, hits_b, n_b)
        lines.append([claim, f"{hits_a} of {n_a}", f"{hits_b} of {n_b}", f"{p:.3f}"])
    table = markdown_table(["claim", "group A", "group B", "one-sided Fisher exact p"], lines)
    intro = (
        "Each claim that one group of seeds met a target more often than another, with the "
        "one-sided Fisher exact test of the two counts (A higher). The counts and where they "
        "were read are in each claim and in the command line above."
    )
    text = results_text(
        "Exact tests of the count claims",
        command_line("smelt_interp.commands.claim_tests", argv),
        [intro, table_block("count-tests", table)],
    )
    atomic_write_text(args.results, text)
    print(text)
    return 0


if __name__ == "__main__":
    run_cli(claim_tests_main)
