"""`python -m smelt_interp.commands.readme_figures [--check] [--readme README.md]` (or
`make readme-figures`): keep the README's measured figures equal to the results files that
measured them.

Tables: every `<!-- results: docs/results/NAME.md#TABLE -->` ... `<!-- /results -->` block of the
README is rewritten from the results file's `<!-- table: TABLE -->` block (`smelt_interp.results`
defines the format). With `--check` nothing is written; a stale block, or a results table that
no README block shows, is listed and the exit code is 1. A block naming a missing file or table
is bad input: one `error: ...` line, exit 2.

Prose: `unsourced_figures` finds, section by section (`##` and `###` headings), every
measured-looking number outside the blocks that no source of its section holds (FIGURE says which
numbers look measured, SETTINGS which phrases are settings instead). A section's sources are the
results files it names whose header says which command and commit measured them (a .csv or
.json counts through the .md beside it), and the decimals of smelt_interp/paper.py, the paper's
published values that the README quotes. The command lists these too, and exits 1."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from smelt_interp.atomic import atomic_write_text, read_input_text
from smelt_interp.cli import ArgumentParser, run_cli
from smelt_interp.errors import ResultsError
from smelt_interp.results import MAX_BYTES, marked_blocks, read_results

BLOCK_OPEN = re.compile(r"<!-- results: (?P<path>docs/results/[\w.-]+\.md)#(?P<table>[\w.-]+) -->")
BLOCK_CLOSE = "<!-- /results -->"
RESULTS_DIR = "docs/results"
PAPER = "smelt_interp/paper.py"
LINKED = re.compile(r"docs/results/[\w.-]+\.(?:md|csv|json)")
HEADING = re.compile(r"^#{2,3} .*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]+`")

NUM = r"\d+(?:,\d{3})*(?:\.\d+)?"
# A measured-looking number: a decimal (0.825, 2.408), a percentage (41%, +0.40%), a ratio (0.82x,
# 5-7x), a count in millions (4.9M, matched against 4,915,200) or a time (466 s, 8-22 min); a
# range counts as both its ends. Plain integers are counts or settings (d_model 128, 1,700 steps)
# and are not checked. Not a figure: a number inside a word
# or a dotted name (bf16, Dyck-4, 2.13.0, 127.0.0.1), an exponent (Sink^0.3), inline code and
# fenced code (commands and their flags).
FIGURE = re.compile(
    rf"(?<![\w.^/=+-])(?P<a>[+-]?{NUM})(?:-(?P<b>{NUM}))?"
    r"(?P<unit>%|x\b|M\b|\s(?:s|ms|min|minutes)\b)?(?!\d|[.,]\d)"
)
# Phrases whose numbers are settings or definitions, not measurements (each one says why).
SETTINGS = [
    r"95% (?:\w+[ -])*?intervals?",  # the confidence level of an interval
    r"Python >= \d+\.\d+",  # the supported Python
    r"(?:weight decay|lr) \d+(?:\.\d+)?",  # training settings of a preset
    r"(?:above|at least) 0\.\d+|BOS mass 0\.\d+ or more",  # a threshold or a target
    r"every \d+ s",  # the dashboard's refresh interval
    r"at most \d+ minutes",  # the GPU check's time limit
    r"Tolerances are \d+% on FLOPs and KV and \d+% on parameters",  # the matcher's tolerances
    r"\(\d+% of tokens",  # a data blend's shares, as the preset sets them
    r"trigger tasks \(\d+%",
    r"row \(\d+%\)",
    r"\(\d+%\) and arithmetic \(\d+%\)",
    r"\(\d+%\) and Python source \(\d+%\)",
]
SETTING = re.compile("|".join(f"(?:{s})" for s in SETTINGS))


@dataclass(frozen=True)
class Sync:
    """The README with its blocks rewritten, the blocks that differed from their results
    tables, and the results tables that no README block shows (each as FILE#TABLE)."""

    text: str
    stale: list[str]
    unshown: list[str]


def sync(readme: str, root: Path) -> Sync:
    """`readme` with every results block rewritten from its results file under `root`. A block
    naming a missing file, a file without the header lines or a missing table is ResultsError."""
    stale: list[str] = []
    shown: set[str] = set()
    parts, done = [], 0
    for block in marked_blocks(readme, BLOCK_OPEN, BLOCK_CLOSE, "README"):
        m = block.opening
        where = f"{m['path']}#{m['table']}"
        table = read_results(root / m["path"]).table(m["table"])
        shown.add(where)
        if block.body.strip() != table:
            stale.append(where)
        parts += [readme[done : block.start], f"<!-- results: {where} -->\n{table}\n{BLOCK_CLOSE}"]
        done = block.end
    text = "".join([*parts, readme[done:]])
    unshown = []
    for path in sorted((root / RESULTS_DIR).glob("*.md")):
        try:
            tables = read_results(path).tables
        except ResultsError:
            continue  # a record without the header lines holds no README tables
        rel = path.relative_to(root).as_posix()
        unshown += [f"{rel}#{t}" for t in tables if f"{rel}#{t}" not in shown]
    return Sync(text, stale, unshown)


def sections(readme: str) -> Iterator[tuple[str, str]]:
    """(heading, text) of the introduction and of each `##`/`###` section (a `#` line inside
    fenced code is no heading)."""
    blank = FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), readme)  # same offsets, no code
    starts = [0, *(m.start() for m in HEADING.finditer(blank) if m.start() > 0)]
    for start, end in zip(starts, [*starts[1:], len(readme)]):
        part = readme[start:end]
        yield part.splitlines()[0], part


def figures(prose: str) -> list[str]:
    """The measured-looking numbers of `prose` (see FIGURE), each end of a range on its own,
    with its sign and without its unit."""
    prose = INLINE_CODE.sub("", FENCE.sub("", without_blocks(prose)))
    prose = " ".join(prose.split())  # a setting phrase may span lines
    found = []
    for m in FIGURE.finditer(SETTING.sub("", prose)):
        ends = [m["a"], *([m["b"]] if m["b"] else [])]
        if m["unit"] or any("." in e for e in ends):
            found += [e + ("M" if m["unit"] == "M" else "") for e in ends]
    return found


def without_blocks(text: str) -> str:
    """`text` with its complete results blocks cut out (an unclosed marker is left as text)."""
    blocks = marked_blocks(text, BLOCK_OPEN, BLOCK_CLOSE, "README", strict=False)
    starts, ends = [0, *(b.end for b in blocks)], [*(b.start for b in blocks), len(text)]
    return "".join(text[a:b] for a, b in zip(starts, ends))


def numbers(text: str) -> list[str]:
    """Every number of a source's text, signed."""
    return re.findall(rf"[+-]?{NUM}|[+-]?\.\d+", text)


def holds(source: Sequence[str], figure: str) -> bool:
    """Whether a source number, rounded half up to the figure's decimals, is the figure (a
    figure in millions against the source number over 1e6): a source may be more precise than
    the README, never less."""
    scale = 6 if figure.endswith("M") else 0
    figure = figure.removesuffix("M").replace(",", "")
    want = Decimal(figure)
    places = len(figure.split(".")[1]) if "." in figure else 0
    step = Decimal(1).scaleb(-places)
    for n in source:
        have = Decimal(n.replace(",", "")).scaleb(-scale)
        if -have.as_tuple().exponent >= places and have.quantize(step, ROUND_HALF_UP) == want:
            return True
    return False


def section_sources(part: str, root: Path) -> list[Path]:
    """The results files that back `part`: those it names with a valid header (a raw .csv or
    .json through the .md beside it)."""
    found = []
    for link in dict.fromkeys(LINKED.findall(part)):
        path = root / link
        try:
            read_results(path.with_suffix(".md"))
        except ResultsError:
            continue  # not written by a command that says what measured it: no source
        if path.is_file():
            found.append(path)
    return found


def paper_values(root: Path) -> list[str]:
    """The decimals of smelt_interp/paper.py under `root` (none where it is absent): the paper's
    published values, which the README quotes beside ours."""
    paper = root / PAPER
    return [n for n in numbers(read_text(paper)) if "." in n] if paper.is_file() else []


def read_text(path: Path) -> str:
    return read_input_text(path, MAX_BYTES, ResultsError, "results file")


def unsourced_figures(readme: str, root: Path) -> dict[str, list[str]]:
    """By section heading, the figures (see `figures`) that none of the section's sources hold."""
    missing = {}
    for heading, part in sections(readme):
        source = [n for p in section_sources(part, root) for n in numbers(read_text(p))]
        source += paper_values(root)
        lost = [f for f in figures(part) if not holds(source, f)]
        if lost:
            missing[heading] = lost
    return missing


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite (or with --check only compare) the README's results blocks; list what is stale,
    unshown or unsourced."""
    p = ArgumentParser(
        prog="python -m smelt_interp.commands.readme_figures",
        description="Rewrite the README's results blocks from docs/results; --check only lists "
        "stale blocks and unsourced figures.",
    )
    p.add_argument("--readme", type=Path, default=Path("README.md"))
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = p.parse_args(argv)
    readme = read_input_text(args.readme, MAX_BYTES, ResultsError, "README")
    root = args.readme.resolve().parent
    done = sync(readme, root)
    unsourced = unsourced_figures(done.text, root)
    for where in done.stale:
        print(f"{'stale' if args.check else 'rewritten'}: {where}", file=sys.stderr)
    for where in done.unshown:
        print(f"not in the README: {where}", file=sys.stderr)
    for heading, lost in unsourced.items():
        print(f"unsourced: {heading}: {', '.join(lost)}", file=sys.stderr)
    if not args.check and done.stale:
        atomic_write_text(args.readme.resolve(), done.text)  # a linked README stays a link
    return 1 if done.unshown or unsourced or (args.check and done.stale) else 0


if __name__ == "__main__":
    run_cli(main)
