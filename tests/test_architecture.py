"""The package's shape, checked from its source (docs/design.md describes it):

1. Every module imports.
2. Imports point one way: each module belongs to a layer of LAYERS and imports only modules of
   lower layers or of its own package; the groups that share a layer do not import each other;
   and the import graph has no cycle. Imports under `if __name__ == "__main__":` (a command's
   entry) and `if TYPE_CHECKING:` (annotations only) do not count; imports inside functions do.
3. Command-line code (argparse, smelt_interp.cli) lives only in `__main__` and `cli` modules.
4. No block of MIN_BLOCK or more lines repeats across the package, verbatim or in shape.

Each failure lists every offender with its file and line."""

from __future__ import annotations

import ast
import importlib
import io
import keyword
import tokenize
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "smelt_interp"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# --------------------------------------------------------------------------------------
# The allowed direction, written down once: a module may import modules of a lower row or of
# its own group. Groups in one row are siblings: they do not import each other. A group is a
# top-level module or package of smelt_interp; `errors` sits below everything that raises.
# --------------------------------------------------------------------------------------

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("paper", "atomic", "cli"),  # reference numbers, atomic/JSON writing, argparse helpers
    ("config",),
    ("model", "budget"),
    ("checkpoint",),
    ("data",),
    ("train", "probes", "analysis"),  # computation over models and data
    ("figures",),
    ("report", "app"),  # and every command line: see is_command_line
)
# The top row also holds the package's face (smelt_interp/__init__.py) and every command line:
# `<group>.__main__` and `<group>.cli` modules (smelt_interp.cli itself is the helpers, row 1).
TOP = len(LAYERS) - 1


def is_command_line(module: str) -> bool:
    parts = module.split(".")
    return parts[-1] == "__main__" or (len(parts) >= 3 and parts[-1] == "cli")


def group_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(module: str) -> int:
    if module == PACKAGE or is_command_line(module):
        return TOP
    for index, row in enumerate(LAYERS):
        if group_of(module) in row:
            return index
    raise AssertionError(f"{module} is in no layer: add its group to LAYERS in {__file__}")


# --------------------------------------------------------------------------------------
# The import graph, from the source (nothing is executed)
# --------------------------------------------------------------------------------------


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int

    def __str__(self) -> str:
        where = MODULES[self.source].relative_to(ROOT.parent)
        return (
            f"{where}:{self.line}: {self.source} (row {layer_of(self.source)}) imports "
            f"{self.target} (row {layer_of(self.target)})"
        )


def _skipped_guard(test: ast.expr) -> bool:
    """`__name__ == "__main__"` or `TYPE_CHECKING` / `typing.TYPE_CHECKING`."""
    if isinstance(test, ast.Name | ast.Attribute):
        return (test.id if isinstance(test, ast.Name) else test.attr) == "TYPE_CHECKING"
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def _resolve(name: str) -> str | None:
    """The package module that `import name` loads last: the longest prefix that exists."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in MODULES:
            return ".".join(parts)
        parts.pop()
    return None


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the importing module's package
            package = module.split(".")
            if MODULES.get(module, Path()).name != "__init__.py":
                package.pop()
            package = package[: len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        # `from pkg import mod` imports pkg.mod when that is a module, else a name of pkg
        names = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
            for alias in node.names
        ]
    out = []
    for name in dict.fromkeys(names):
        if name == PACKAGE or name.startswith(PACKAGE + "."):
            resolved = _resolve(name)
            if resolved and resolved != module:
                out.append(resolved)
    return out


def import_statements(source: str) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module's source that counts (see the module docstring)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _skipped_guard(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def source_of(module: str) -> str:
    return MODULES[module].read_text(encoding="utf-8")


def imports_of(module: str, source: str | None = None) -> list[Edge]:
    """The package modules `module` imports (its file, or `source` when given)."""
    return [
        Edge(module, target, node.lineno)
        for node in import_statements(source_of(module) if source is None else source)
        for target in _targets(node, module)
    ]


def graph() -> list[Edge]:
    return [edge for module in MODULES for edge in imports_of(module)]


def forbidden(edge: Edge) -> str | None:
    """Why `edge` breaks the direction, or None when it is allowed."""
    src, dst = layer_of(edge.source), layer_of(edge.target)
    if dst > src:
        return "upward"
    if dst == src and group_of(edge.source) != group_of(edge.target):
        # a command line (or the top row's report and app) may reuse another command's parser
        top_reuses_command = src == TOP and is_command_line(edge.target)
        if not (is_command_line(edge.source) or edge.source == PACKAGE or top_reuses_command):
            return "sibling"
    return None


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    succ: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        succ[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index:
            strongconnect(v)
    return found


# --------------------------------------------------------------------------------------
# Tests: imports
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_imports(module):
    importlib.import_module(module)


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


def test_imports_point_one_way():
    bad = [f"{why}: {edge}" for edge in graph() if (why := forbidden(edge))]
    assert not bad, "imports against the direction of LAYERS:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    edges = graph()
    found = cycles(edges)
    lines = []
    for component in found:
        members = set(component)
        lines.append(" <-> ".join(component))
        lines += [f"    {e}" for e in edges if e.source in members and e.target in members]
    assert not found, "import cycles:\n" + "\n".join(lines)


def test_command_lines_sit_at_the_top():
    """Argument parsing lives at the top (`__main__`/`cli` modules and the top row's report),
    not in computation modules: only they and the shared helpers in smelt_interp/cli.py import
    argparse or smelt_interp.cli."""
    bad = []
    for module in MODULES:
        if layer_of(module) == TOP or module == f"{PACKAGE}.cli":
            continue
        for node in import_statements(source_of(module)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            if "argparse" in names or f"{PACKAGE}.cli" in names:
                bad.append(f"{MODULES[module].relative_to(ROOT.parent)}:{node.lineno}: {module}")
    assert not bad, "command-line code outside __main__/cli modules:\n" + "\n".join(bad)


def test_the_checker_sees_what_it_should():
    """Module-level, function-level and relative imports count; the two guards do not."""
    snippet = (
        "from typing import TYPE_CHECKING\n"
        "from smelt_interp.errors import FitError\n"
        "from . import scaling\n"
        "from ..figures import theme\n"
        "if TYPE_CHECKING:\n"
        "    from smelt_interp.app import server\n"
        "def f():\n"
        "    import smelt_interp.figures.page\n"
        'if __name__ == "__main__":\n'
        "    from smelt_interp.report import main\n"
    )
    edges = imports_of(f"{PACKAGE}.analysis.snippet", snippet)  # as if it were analysis/snippet.py
    targets = {e.target: e for e in edges}
    assert set(targets) == {
        "smelt_interp.errors",
        "smelt_interp.analysis.scaling",
        "smelt_interp.figures.theme",
        "smelt_interp.figures.page",
    }
    assert forbidden(targets["smelt_interp.figures.theme"]) == "upward"
    assert forbidden(targets["smelt_interp.errors"]) is None
    assert forbidden(Edge("smelt_interp.analysis.downstream", "smelt_interp.train", 1)) == (
        "sibling"
    )
    assert forbidden(Edge("smelt_interp.analysis.cli", "smelt_interp.figures.scaling", 1)) is None
    loop = [Edge("smelt_interp.figures.page", "smelt_interp.figures.theme", 1)]
    loop.append(Edge("smelt_interp.figures.theme", "smelt_interp.figures.page", 2))
    assert cycles(loop) == [["smelt_interp.figures.page", "smelt_interp.figures.theme"]]


# --------------------------------------------------------------------------------------
# Repeated blocks
#
# Each file becomes a list of normalised lines: comments, blank lines, docstrings and import
# statements are dropped, and every identifier becomes `N`, every string `S`, every number
# `0` (keywords stay), so two blocks that differ only in names read the same. A repeat is a
# run of MIN_BLOCK consecutive normalised lines that occurs twice (in one file or two) and is
# not trivial.
#
# Exempt, because repeating their shape is the point of them:
# - dataclass fields and other annotated names (`name: type = default`): dropped;
# - attribute declarations built only from names, literals and calls (`self.hook_q =
#   HookPoint()`, `self.n_layers = cfg.n_layers`): data, not logic;
# - tables: continuation lines (inside brackets) that hold only literals, names, calls and
#   punctuation, such as the entries of a preset, the rows of a reference table or the keyword
#   arguments of a figure's layout (`x=0.5,`, `"d_model": 128,`, `(0.0, 0.5),`,
#   `Input("run", "n_clicks"),`): data, not logic;
# - module constants built the same way (`PATH = "/routing"`, `CONTROLS = {`): a page's or a
#   probe's declaration, data, not logic;
# - declarations: decorators and class/def headers with their parameter lists (one API keeps
#   one style of signature on purpose).
# Tables and declarations stay in the sequence (a run must match them too) but are not logic:
# a run is reported only if at least MIN_LOGIC of its lines are logic.
# --------------------------------------------------------------------------------------

MIN_BLOCK = 6
MIN_LOGIC = 3  # lines of logic a repeated run must contain to be reported
_LAYOUT_TOKENS = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}
_OPEN, _CLOSE = {"(", "[", "{"}, {")", "]", "}"}
_DATA_TOKENS = set("N S 0 True False None , : = ( ) [ ] { } - . * **".split())


@dataclass(frozen=True)
class Line:
    path: Path
    number: int
    text: str  # normalised
    logic: bool  # neither a table line nor a declaration (see above)


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def _declaration_lines(tree: ast.AST) -> set[int]:
    """Decorators and the headers of classes and functions (signatures included)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                lines.update(range(decorator.lineno, decorator.end_lineno + 1))
            lines.update(range(node.lineno, node.body[0].lineno))
    return lines


def _skipped_lines(tree: ast.AST) -> set[int]:
    """Imports, annotated names (dataclass fields) and docstrings."""
    lines = _docstring_lines(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom | ast.AnnAssign):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def normalised_lines(path: Path) -> list[Line]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    skipped, declarations = _skipped_lines(tree), _declaration_lines(tree)
    constants = {node.lineno for node in tree.body if isinstance(node, ast.Assign)}
    by_line: dict[int, list[str]] = defaultdict(list)
    depth_at: dict[int, int] = {}  # bracket depth where each line starts (> 0: continuation)
    depth = 0
    in_fstring = 0  # Python 3.12+ splits an f-string into tokens: it stays one S here
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        row, kind = tok.start[0], tokenize.tok_name[tok.type]
        if tok.type in _LAYOUT_TOKENS:
            continue
        depth_at.setdefault(row, depth)
        if kind in ("FSTRING_START", "FSTRING_END") or in_fstring:
            in_fstring += (kind == "FSTRING_START") - (kind == "FSTRING_END")
            text = "S" if kind == "FSTRING_START" and in_fstring == 1 else ""
        elif tok.type == tokenize.NAME:
            text = tok.string if keyword.iskeyword(tok.string) else "N"
        elif tok.type == tokenize.STRING:
            text = "S"
        elif tok.type == tokenize.NUMBER:
            text = "0"
        else:
            text = tok.string
            depth += (text in _OPEN) - (text in _CLOSE)
        if text and row not in skipped:
            by_line[row].append(text)
    out = []
    for row in sorted(by_line):
        tokens = by_line[row]
        field = tokens[:4] == ["N", ".", "N", "="]  # self.hook_q = HookPoint()
        data = (depth_at[row] > 0 or field or row in constants) and set(tokens) <= _DATA_TOKENS
        logic = not data and row not in declarations
        out.append(Line(path, row, " ".join(tokens), logic))
    return out


def repeated_blocks(files: list[Path]) -> list[tuple[Line, Line, int]]:
    """(first occurrence, repeat, length) for each maximal repeated run, longest first."""
    lines = {path: normalised_lines(path) for path in files}
    seen: dict[tuple[str, ...], tuple[Path, int]] = {}
    found: list[tuple[Line, Line, int]] = []
    covered: set[tuple[Path, int]] = set()
    for path in files:
        seq = lines[path]
        for i in range(len(seq) - MIN_BLOCK + 1):
            window = seq[i : i + MIN_BLOCK]
            if sum(line.logic for line in window) < MIN_LOGIC:
                continue
            key = tuple(line.text for line in window)
            first = seen.setdefault(key, (path, i))
            if first == (path, i) or (path, i) in covered:
                continue
            other = lines[first[0]]
            if first[0] == path and i < first[1] + MIN_BLOCK:
                continue  # overlaps its own first occurrence
            n = MIN_BLOCK  # extend the match as far as it goes
            while (
                i + n < len(seq)
                and first[1] + n < len(other)
                and (first[0], first[1] + n) != (path, i)
                and seq[i + n].text == other[first[1] + n].text
            ):
                n += 1
            covered.update((path, i + k) for k in range(n))
            found.append((other[first[1]], seq[i], n))
    return sorted(found, key=lambda f: -f[2])


def test_no_repeated_blocks():
    found = repeated_blocks(sorted(ROOT.rglob("*.py")))
    report = [
        f"{n} lines: {a.path.relative_to(ROOT.parent)}:{a.number} and "
        f"{b.path.relative_to(ROOT.parent)}:{b.number}"
        for a, b, n in found
    ]
    assert not found, "blocks that repeat (same lines or same shape):\n" + "\n".join(report)


def test_the_block_checker_sees_same_shape(tmp_path):
    """Two functions that differ only in names are caught; a table and fields are not."""
    body = (
        "def {f}({x}):\n"
        "    {y} = {x} + 1\n"
        "    if {y} > 2:\n"
        "        {y} = {z}({y})\n"
        "    for {k} in range({y}):\n"
        "        print({k}, {x})\n"
        "    return {y} * 2\n"
    )
    (tmp_path / "a.py").write_text(body.format(f="f", x="a", y="b", z="c", k="i"))
    (tmp_path / "b.py").write_text(body.format(f="g", x="p", y="q", z="r", k="j"))
    table = "".join(
        f'    "{name}": dict(width={i}, depth={i + 1}),\n' for i, name in enumerate("abcdefgh")
    )
    fields = "".join(f"    {name}: int = {i}\n" for i, name in enumerate("abcdefgh"))
    (tmp_path / "c.py").write_text(f"A = {{\n{table}}}\nB = {{\n{table}}}\n")
    (tmp_path / "d.py").write_text(f"class P:\n{fields}\nclass Q:\n{fields}")
    found = repeated_blocks(sorted(tmp_path.glob("*.py")))
    assert [(a.path.name, b.path.name, n) for a, b, n in found] == [("a.py", "b.py", 7)]
