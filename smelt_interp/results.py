"""Results files: measured figures with the command and the commit that measured them.

A results file is docs/results/NAME.md (raw data may sit beside it as NAME.csv or NAME.json).
Within its first HEADER_LINES lines it has a line `Command: ` followed by the exact command in
backticks and a line `Commit: <short sha>` (the sha may end in `+changes`, for a working tree
that differed from the commit). A table meant for the README sits between the lines
`<!-- table: TABLE -->` and `<!-- /table -->`; the README shows it between
`<!-- results: docs/results/NAME.md#TABLE -->` and `<!-- /results -->`, with the same content
(`smelt_interp.commands.readme_figures` keeps the two equal)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from smelt_interp.errors import ResultsError
from smelt_interp.files import atomic_write_text, read_input_text

HEADER_LINES = 10
MAX_BYTES = 4 << 20  # results files are pages of tables, never this large
COMMAND = re.compile(r"^Command: `(?P<command>[^`]+)`\s*$", re.M)
COMMIT = re.compile(r"^Commit: (?P<commit>[0-9a-f]{7,40}(?:\+changes)?)\s*$", re.M)
TABLE_OPEN = re.compile(r"<!-- table: (?P<name>[\w.-]+) -->")
TABLE_CLOSE = "<!-- /table -->"
# A line that opens or closes a README block or a results table: never inside a table's body
# (the README would read the table's copy as the end of its block, or as another block).
MARKER = re.compile(r"^<!-- (?:/?table|/?results)\b.*-->\s*$", re.M)


@dataclass(frozen=True)
class Block:
    """A marked block of a text: its opening marker's match, the offsets of the whole block
    (opening line to closing marker, without the closing newline) and of its body."""

    opening: re.Match[str]
    start: int
    end: int
    body: str


def marked_blocks(
    text: str, opening: re.Pattern[str], closing: str, where: object, *, strict: bool = True
) -> list[Block]:
    """Every block from a line `opening` matches whole to the next line equal to `closing`, in
    one pass over the lines (linear in the text, however many markers are left open). With
    `strict`, an opening marker not closed before the next opening one or the end of the text
    is a ResultsError naming `where` and the line; without it, such a marker is skipped."""
    blocks: list[Block] = []
    current: tuple[re.Match[str], int, int, int] | None = None  # match, start, body, line
    offset = 0
    for number, line in enumerate(text.split("\n"), 1):
        found = opening.fullmatch(line)
        if found is not None:
            if current is not None and strict:
                raise ResultsError(_unclosed(where, current[3], closing))
            current = (found, offset, offset + len(line) + 1, number)
        elif line == closing and current is not None:
            match, start, body, _ = current
            blocks.append(Block(match, start, offset + len(line), text[body:offset]))
            current = None
        offset += len(line) + 1
    if current is not None and strict:
        raise ResultsError(_unclosed(where, current[3], closing))
    return blocks


def _unclosed(where: object, line: int, closing: str) -> str:
    return f"{where}: line {line}: a block opened there is not closed by {closing!r}"


def check_table_body(where: object, name: str, body: str) -> None:
    """A table body holding a marker line is a ResultsError: copied into the README, it would
    end the block early (each rewrite adding another copy) or open another."""
    marker = MARKER.search(body)
    if marker is not None:
        raise ResultsError(f"{where}: table {name!r} holds the marker line {marker[0].strip()!r}")


@dataclass(frozen=True)
class Results:
    """A parsed results file: its command, its commit and its README tables by name."""

    path: Path
    command: str
    commit: str
    tables: Mapping[str, str]

    def table(self, name: str) -> str:
        if name not in self.tables:
            known = ", ".join(self.tables) or "none"
            raise ResultsError(f"{self.path} has no table {name!r} (its tables: {known})")
        return self.tables[name]


def source_commit() -> str:
    """The git commit of this checkout (with "+changes" when tracked files differ from it), or
    "unknown" outside a git checkout: results say which code measured them."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=here, capture_output=True, text=True)

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except OSError:
        return "unknown"
    if head.returncode != 0 or not head.stdout.strip():
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def command_line(module: str, argv: Sequence[str]) -> str:
    """The `python -m MODULE ARGS` line that reruns a command, quoted for a shell."""
    return " ".join(["python", "-m", module, *map(shlex.quote, argv)])


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A pipe table (each cell as str), the form both the results file and the README show."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(c) for c in line) + " |" for line in lines)


def table_block(name: str, table: str) -> str:
    """`table` between the markers that name it for the README."""
    return f"<!-- table: {name} -->\n{table.strip()}\n<!-- /table -->"


def results_text(title: str, command: str, parts: Sequence[str], commit: str | None = None) -> str:
    """A results file: the title, the header lines, then `parts` (prose, table blocks, output)
    separated by blank lines."""
    head = [f"# {title}", "", f"Command: `{command}`", f"Commit: {commit or source_commit()}"]
    return "\n\n".join(["\n".join(head), *(p.strip() for p in parts)]) + "\n"


def write_results(
    path: str | Path, title: str, command: str, parts: Sequence[str], commit: str | None = None
) -> Path:
    """Write a results file atomically (a failed write keeps the previous one)."""
    return atomic_write_text(path, results_text(title, command, parts, commit))


def parse_results(text: str, path: Path) -> Results:
    """The header lines and tables of a results file's `text`."""
    head = "\n".join(text.splitlines()[:HEADER_LINES])
    command, commit = COMMAND.search(head), COMMIT.search(head)
    if not command or not commit:
        raise ResultsError(
            f"{path} lacks a 'Command: `...`' and a 'Commit: <sha>' line in its first "
            f"{HEADER_LINES} lines"
        )
    tables = {}
    for block in marked_blocks(text, TABLE_OPEN, TABLE_CLOSE, path):
        name = block.opening["name"]
        check_table_body(path, name, block.body)
        tables[name] = block.body.strip()
    return Results(path, command["command"], commit["commit"], tables)


def read_results(path: str | Path) -> Results:
    """Parse the results file at `path` (missing, unreadable or headerless: ResultsError)."""
    path = Path(path)
    text = read_input_text(path, MAX_BYTES, ResultsError, "results file")
    return parse_results(text, path)


class _Tee(io.TextIOBase):
    """A text stream that writes through to `out` and keeps a copy."""

    def __init__(self, out: io.TextIOBase) -> None:
        self.out, self.copy = out, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


@dataclass
class Record:
    """What a command printed inside `recording`, and the table blocks it added (`parts`)."""

    title: str
    command: str
    parts: list[str] = field(default_factory=list)
    output: str = ""

    @property
    def text(self) -> str:
        """The results file: the parts, then the printed output as a text block."""
        return results_text(
            self.title, self.command, [*self.parts, f"Output:\n\n```text\n{self.output}\n```"]
        )


@contextlib.contextmanager
def recording(title: str, command: str) -> Iterator[Record]:
    """Keep a copy of what the block prints (it still reaches stdout), so that a command can
    write its report as a results file: every printed figure on record with its command."""
    record = Record(title, command)
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield record
    record.output = tee.copy.getvalue().rstrip("\n")
