"""`python -m smelt_interp.commands.readme_figures [--check] [--readme PAGE ...]` (or
`make readme-figures`): keep the measured figures of the README and of the two pages it links
for the rest (docs/guide.md, docs/results.md) equal to the results files that measured them.

Tables: every `<!-- results: docs/results/NAME.md#TABLE -->` ... `<!-- /results -->` block of the
README is rewritten from the results file's `<!-- table: TABLE -->` block (`smelt_interp.results`
defines the format). With `--check` nothing is written; a stale block, or a results table that
no README block shows, is listed and the exit code is 1. A block naming a missing file or table
is bad input: one `error: ...` line, exit 2.

Prose: `unsourced_figures` finds, section by section (`##` and `###` headings), every
measured-looking number outside the blocks that no source of its section holds (FIGURE says which
numbers look measured, SETTINGS which phrases are settings instead; SPELLED finds amounts written
in words, "under three minutes", checked as their value). A section's sources are the
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

from smelt_interp.cli import ArgumentParser, run_cli
from smelt_interp.errors import ResultsError
from smelt_interp.files import atomic_write_text, read_input_text
from smelt_interp.results import MAX_BYTES, marked_blocks, read_results

BLOCK_OPEN = re.compile(r"<!-- results: (?P<path>docs/results/[\w.-]+\.md)#(?P<table>[\w.-]+) -->")
BLOCK_CLOSE = "<!-- /results -->"
RESULTS_DIR = "docs/results"
PAPER = "smelt_interp/paper.py"
# A results file named from the repository root (docs/results/X.md) or from a page in docs/
# (results/X.md, as docs/guide.md and docs/results.md link them).
LINKED = re.compile(r"(?:docs/)?results/[\w.-]+\.(?:md|csv|json)")
# The pages whose figures are kept: the README and the two pages it links for the rest.
PAGES = ("README.md", "docs/guide.md", "docs/results.md")
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
# A measured amount spelled out in words ("under three minutes", "about a quarter of an hour",
# "half an hour", "twenty percent"): a figure all the same, checked as its value in the unit it
# names, so a stale spelled-out figure fails the check as a stale digit would.
WORD_VALUES = {
    "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "fifteen": "15",
    "twenty": "20", "thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "ninety": "90",
    "a hundred": "100", "a quarter": "0.25", "a third": "0.33", "half": "0.5", "a half": "0.5",
    "three quarters": "0.75",
}  # fmt: skip
SPELLED = re.compile(
    r"\b(?P<word>" + "|".join(sorted(WORD_VALUES, key=len, reverse=True)) + r")"
    r"(?:\s+(?:of\s+)?an?)?\s+(?:seconds?|minutes?|hours?|days?|percent|times)\b",
    re.I,
)


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
    found += [WORD_VALUES[m["word"].lower()] for m in SPELLED.finditer(prose)]
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


def section_sources(part: str, root: Path, page_dir: Path | None = None) -> list[Path]:
    """The results files that back `part`: those it names with a valid header (a raw .csv or
    .json through the .md beside it). A `docs/results/...` name is read from `root`, a bare
    `results/...` from the page's own folder (`page_dir`, by default `root`)."""
    found = []
    links = LINKED.findall(part)
    paths = [(root if l.startswith("docs/") else page_dir or root) / l for l in links]
    for path in dict.fromkeys(p.resolve() for p in paths):
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


def unsourced_figures(
    readme: str, root: Path, page_dir: Path | None = None
) -> dict[str, list[str]]:
    """By section heading, the figures (see `figures`) that none of the section's sources hold."""
    missing = {}
    for heading, part in sections(readme):
        sources = section_sources(part, root, page_dir)
        source = [n for p in sources for n in numbers(read_text(p))]
        source += paper_values(root)
        lost = [f for f in figures(part) if not holds(source, f)]
        if lost:
            missing[heading] = lost
    return missing


def repo_root(page: Path) -> Path:
    """The folder that holds `docs/results` above `page` (a page in docs/ sits one level down);
    the page's own folder where none does."""
    here = page.resolve().parent
    for folder in (here, *here.parents):
        if (folder / RESULTS_DIR).is_dir():
            return folder
    return here


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite (or with --check only compare) the pages' results blocks; list what is stale,
    unshown or unsourced."""
    p = ArgumentParser(
        prog="python -m smelt_interp.commands.readme_figures",
        description="Rewrite the results blocks of the README and its pages from docs/results; "
        "--check only lists stale blocks and unsourced figures.",
    )
    p.add_argument(
        "--readme",
        type=Path,
        action="append",
        help=f"a page to keep (repeatable; default: {', '.join(PAGES)})",
    )
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = p.parse_args(argv)
    pages = args.readme or [Path(page) for page in PAGES]
    texts = [read_input_text(page, MAX_BYTES, ResultsError, "README") for page in pages]
    root = repo_root(pages[0])
    unshown: set[str] | None = None
    failed = False
    for page, text in zip(pages, texts):
        done = sync(text, root)
        unsourced = unsourced_figures(done.text, root, page.resolve().parent)
        for where in done.stale:
            print(f"{'stale' if args.check else 'rewritten'}: {where} ({page})", file=sys.stderr)
        for heading, lost in unsourced.items():
            print(f"unsourced: {heading}: {', '.join(lost)} ({page})", file=sys.stderr)
        if not args.check and done.stale:
            atomic_write_text(page.resolve(), done.text)  # a linked page stays a link
        # A table shown on any one page is shown.
        unshown = set(done.unshown) if unshown is None else unshown & set(done.unshown)
        failed |= bool(unsourced) or (args.check and bool(done.stale))
    for where in sorted(unshown or ()):
        print(f"not in the README or its pages: {where}", file=sys.stderr)
    return 1 if unshown or failed else 0


if __name__ == "__main__":
    run_cli(main)
