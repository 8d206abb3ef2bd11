"""The measured figures of the README and its pages (docs/guide.md, docs/results.md) come from
the results files the commands wrote (smelt_interp.results; the format is in its docstring). Their
tables between results markers equal the results files' tables, and every measured-looking number
of their prose and other tables is in a results file its section names, so a figure edited by
hand, or left behind when the results are regenerated, fails here. `make readme-figures`
(smelt_interp.commands.readme_figures) rewrites the tables; `--check` reports the same findings
as these tests."""

from __future__ import annotations

import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest

from smelt_interp.commands.readme_figures import (
    BLOCK_CLOSE,
    BLOCK_OPEN,
    PAGES,
    figures,
    holds,
    numbers,
    paper_values,
    section_sources,
    sections,
    sync,
    unsourced_figures,
)
from smelt_interp.errors import ResultsError
from smelt_interp.results import marked_blocks, parse_results, recording, results_text, table_block
from smelt_interp.train.ladder import loss_table

REPO = Path(__file__).resolve().parents[2]
# The README and its pages, each with the folder its relative links start from; README is all of
# them in one text, for the checks that do not depend on where a link starts.
PAGE_TEXTS = {page: (REPO / page).read_text(encoding="utf-8") for page in PAGES}
README = "\n".join(PAGE_TEXTS.values())

# Figures of README sections that no results file holds yet, by section: none may be left.
PENDING: dict[str, list[str]] = {}


def unheld(source: list[str], places: int) -> str:
    """A figure with `places` decimals that no number of `source` rounds to."""
    value = Decimal("0.1234567")
    while holds(source, figure := f"{value:.{places}f}"):
        value += Decimal("0.0731")
    return figure


# ----- the README as it stands --------------------------------------------------------------
def test_every_readme_table_block_is_its_results_table():
    done = sync(README, REPO)
    assert len(marked_blocks(README, BLOCK_OPEN, BLOCK_CLOSE, "README")) >= 1
    assert done.stale == [] and done.unshown == [] and done.text == README


def test_every_prose_figure_is_in_a_results_file_of_its_section():
    headings = [h for h, _ in sections(README)]
    assert "## The case study: the sink and retrieval, visit by visit" in headings
    assert len(figures(README)) >= 100  # the rule sees the pages' figures at all
    unsourced = {}
    for page, text in PAGE_TEXTS.items():
        unsourced |= unsourced_figures(text, REPO, (REPO / page).parent)
    assert unsourced == PENDING


def test_the_case_study_tables_are_checked_figure_by_figure():
    part = dict(sections(README))["### The recall pair, test seeds 1-4"]
    rows = [line for line in part.splitlines() if line.startswith("|")]
    prose = [line for line in part.splitlines() if not line.startswith("|")]
    assert len(figures("\n".join(rows))) >= 80
    # the prose's figures are checked too: uniform attention's level and the ablation's
    assert {"0.039", "0.242"} <= set(figures("\n".join(prose)))


# ----- hand edits fail --------------------------------------------------------------------
def test_a_table_block_edited_by_hand_is_caught_and_rewritten():
    block = marked_blocks(README, BLOCK_OPEN, BLOCK_CLOSE, "README")[0]
    whole = README[block.start : block.end]
    first = re.search(r"[+-]?\d+\.\d+", block.body)[0]
    edited = README.replace(whole, whole.replace(first, first + "1", 1))
    done = sync(edited, REPO)
    assert done.stale == [f"{block.opening['path']}#{block.opening['table']}"]
    assert done.text == README


@pytest.mark.parametrize(
    "heading",
    [
        "## The case study: the sink and retrieval, visit by visit",
        "## Scaling laws and downstream gains",
        "## Budgets and the matcher",
        "### The CPU ladder",
    ],
)
def test_a_prose_figure_edited_by_hand_is_caught(heading):
    part = dict(sections(README))[heading]
    first = next(f for f in figures(part) if "." in f)
    linked = section_sources(part, REPO, REPO / "docs")  # README and docs/ pages alike
    source = [n for path in linked for n in numbers(path.read_text(encoding="utf-8"))]
    source += paper_values(REPO)
    edited = unheld(source, len(first.split(".")[1]))
    page = next(page for page, text in PAGE_TEXTS.items() if part in text)
    text = PAGE_TEXTS[page].replace(
        part, re.sub(rf"(?<![\d.]){re.escape(first)}(?!\d)", edited, part)
    )
    assert edited in unsourced_figures(text, REPO, (REPO / page).parent)[heading]


# ----- the rule -----------------------------------------------------------------------------
def test_the_rule_tells_measured_figures_from_settings():
    prose = (
        "It trains d_model 128 for 1,700 steps of 16 x 320 tokens (4.9M tokens) in 466 s, "
        "8-22 min a model; 0.82x the speed, 5-7x slower, 41% of words, +0.40% params, "
        "95% Wilson intervals, Sink^0.3, Dyck-4, torch 2.13.0 at 127.0.0.1, `--set lr=0.3`, "
        "weight decay 0.1, Python >= 3.10, loss 2.408."
    )
    assert figures(prose) == ["4.9M", "466", "8", "22", "0.82", "5", "7", "41", "+0.40", "2.408"]


def test_a_figure_is_held_by_a_source_number_that_rounds_to_it():
    assert holds(["0.34731"], "0.3473") and holds(["29.3"], "+29") and holds(["-325.0"], "-325")
    assert holds(["4,915,200"], "4.9M") and holds(["1,304"], "1,304")
    assert not holds(["0.5"], "0.50")  # a source less precise than the README holds nothing
    assert not holds(["0.34731"], "0.3474") and not holds(["29.3"], "-29")


# ----- the format and the tool --------------------------------------------------------------
TABLE = "| a | b |\n| --- | --- |\n| x | 0.125 |"


def results_dir(tmp_path: Path, text: str) -> Path:
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "r.md").write_text(text, encoding="utf-8")
    return tmp_path


def readme_with(table: str) -> str:
    return f"# t\n\n## S\n\n<!-- results: docs/results/r.md#t -->\n{table}\n<!-- /results -->\n"


def test_a_results_file_names_its_command_and_commit():
    text = results_text("T", "python -m x --y", [table_block("t", TABLE)], commit="abc1234+changes")
    parsed = parse_results(text, Path("r.md"))
    assert (parsed.command, parsed.commit, dict(parsed.tables)) == (
        "python -m x --y",
        "abc1234+changes",
        {"t": TABLE},
    )
    with pytest.raises(ResultsError, match="Commit"):
        parse_results("# T\n\nCommand: `x`\n\n" + table_block("t", TABLE), Path("r.md"))
    with pytest.raises(ResultsError, match="no table 'u'"):
        parsed.table("u")


def test_recording_keeps_what_a_command_printed(capsys):
    with recording("T", "python -m x") as record:
        print("ratio 0.820")
        record.parts.append(table_block("t", TABLE))
    assert capsys.readouterr().out == "ratio 0.820\n"
    parsed = parse_results(record.text, Path("r.md"))
    assert parsed.tables == {"t": TABLE} and "```text\nratio 0.820\n```" in record.text


def run_tool(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "smelt_interp.commands.readme_figures", *args]
    command += ["--readme", str(root / "README.md")]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO)


def test_the_tool_checks_rewrites_and_refuses_bad_blocks(tmp_path):
    root = results_dir(
        tmp_path, results_text("T", "python -m x", [table_block("t", TABLE)], "abc1234")
    )
    readme = root / "README.md"
    readme.write_text(readme_with(TABLE.replace("0.125", "0.126")), encoding="utf-8")
    checked = run_tool(root, "--check")
    assert checked.returncode == 1 and "stale: docs/results/r.md#t" in checked.stderr
    assert readme.read_text(encoding="utf-8") == readme_with(TABLE.replace("0.125", "0.126"))
    assert run_tool(root).returncode == 0
    assert readme.read_text(encoding="utf-8") == readme_with(TABLE)
    assert run_tool(root, "--check").returncode == 0
    for bad, why in [("r.md#u", "no table 'u'"), ("gone.md#t", "gone.md")]:
        readme.write_text(readme_with(TABLE).replace("r.md#t", bad), encoding="utf-8")
        refused = run_tool(root, "--check")
        assert refused.returncode == 2 and why in refused.stderr
        assert refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1


def test_a_results_table_no_readme_block_shows_is_reported(tmp_path):
    root = results_dir(
        tmp_path, results_text("T", "python -m x", [table_block("t", TABLE)], "abc1234")
    )
    assert sync("# t\n", root).unshown == ["docs/results/r.md#t"]


def test_a_figure_counts_only_from_a_results_file_with_its_header(tmp_path):
    prose = "# t\n\n## S\n\nIt took 0.125 s ([r](docs/results/r.md)).\n"
    root = results_dir(tmp_path, "# T\n\n" + TABLE)
    assert unsourced_figures(prose, root) == {"## S": ["0.125"]}
    (root / "docs" / "results" / "r.md").write_text(results_text("T", "x", [TABLE], "abc1234"))
    assert unsourced_figures(prose, root) == {}


def test_the_ladder_table_shows_the_runs_losses():
    runs = pd.read_csv(REPO / "docs" / "results" / "cpu_ladder_runs.csv")
    table = loss_table(runs)
    rows = table.splitlines()[2:]
    assert len(rows) == runs["size"].nunique()
    final = runs[(runs["size"] == 2) & (runs["steps"] == runs["steps"].max())]
    loss = final.set_index("arch")["loss"]
    assert rows[2].endswith(f"| {loss['smelt'] - loss['baseline']:+.3f} |")
    assert f"{loss['smelt']:.3f} |" in rows[2]


def test_a_spelled_out_figure_is_a_figure():
    prose = (
        "It trains in about a quarter of an hour, the six runs took under three minutes each, "
        "half an hour in all, twenty percent faster; two layers and one thread are counts."
    )
    assert figures(prose) == ["0.25", "3", "0.5", "20"]


def test_the_tool_fails_on_a_stale_spelled_out_figure(tmp_path):
    """A results file measured 2 minutes; the page says three: --check exits 1 and names it,
    and passes once the page says two."""
    table = "| run | minutes |\n| --- | --- |\n| x | 2 |"
    text = results_text("T", "python -m x", [table_block("t", table)], "abc1234")
    root = results_dir(tmp_path, text)
    readme = root / "README.md"
    prose = "\n\nThe runs took under {} minutes each ([r](docs/results/r.md)).\n"
    readme.write_text(readme_with(table) + prose.format("three"), encoding="utf-8")
    checked = run_tool(root, "--check")
    assert checked.returncode == 1 and "unsourced: ## S: 3" in checked.stderr
    readme.write_text(readme_with(table) + prose.format("two"), encoding="utf-8")
    assert run_tool(root, "--check").returncode == 0
