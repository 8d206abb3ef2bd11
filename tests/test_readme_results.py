"""The README's case-study figures come from the results files the commands wrote: every
number in the tables of its case-study section appears in the results file the section names,
so a figure edited by hand, or left behind when the results are regenerated, fails here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SECTION = "## The case study: the sink and retrieval, visit by visit"
NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+(?![\w.])")


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def table_numbers(text: str) -> list[str]:
    """Decimal numbers in the Markdown table rows of `text`."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [n for row in rows for n in NUMBER.findall(row)]


def results_files(text: str) -> list[Path]:
    """The docs/results files the text links to."""
    return [REPO / p for p in dict.fromkeys(re.findall(r"\(?(docs/results/[\w./-]+\.md)", text))]


def missing_figures(part: str) -> list[str]:
    """The numbers of `part`'s tables that its results files do not hold."""
    files = results_files(part)
    assert files, "the case-study section names no docs/results file"
    source = "".join(f.read_text(encoding="utf-8") for f in files)
    return [
        n
        for n in table_numbers(part)
        if not re.search(rf"(?<![\w.]){re.escape(n)}(?![\w])", source)
    ]


def readme_section() -> str:
    return section((REPO / "README.md").read_text(encoding="utf-8"), SECTION)


def test_every_case_study_figure_is_in_its_results_file():
    part = readme_section()
    assert len(table_numbers(part)) >= 10, table_numbers(part)
    assert not missing_figures(part)


def test_a_figure_edited_by_hand_is_caught():
    part = readme_section()
    first = table_numbers(part)[0]
    edited = f"{float(first) + 0.0004:.{len(first.split('.')[1]) + 1}f}7"
    assert missing_figures(part.replace(first, edited, 1)) == [edited]
