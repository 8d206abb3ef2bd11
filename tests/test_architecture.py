"""The package's shape, checked from its source (docs/design.md describes it):

1. Every module imports.
2. Imports point one way: the layers contract in pyproject.toml ([tool.importlinter]), checked
   by import-linter. Every import counts (inside functions and under `__main__` guards too);
   only `if TYPE_CHECKING:` imports do not. A test package shows the tool catches each kind.
3. No module imports itself back through others (no import cycle), from grimp's graph of every
   import, `if TYPE_CHECKING:` ones included (an annotation-only import still ties two modules
   together). A throwaway package shows the check catches a circle closed that way.
4. Command lines stay at the top of their group: argparse and smelt_interp.cli are imported
   only by command modules (`__main__`, `cli`, smelt_interp.commands, report, app), and no
   other module imports a command module (a rule by module name, which a layers contract over
   packages cannot state), except that a module's own entry point, the body of its top-level
   `if __name__ == "__main__":` guard, may start its group's `cli` (a probe module does).
5. No block of MIN_BLOCK or more lines repeats across the package, verbatim or in shape.
6. No module is over MAX_MODULE_LINES lines: past that a module holds more than one job.
7. No function is over MAX_FUNCTION_LINES lines, except those LONG_FUNCTIONS names with why.

Each failure lists every offender."""

from __future__ import annotations

import ast
import importlib
import io
import keyword
import textwrap
import tokenize
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import grimp
import pytest
from importlinter.cli import lint_imports

PACKAGE = "smelt_interp"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
PYPROJECT = ROOT.parent / "pyproject.toml"
# modules that are command lines: they may parse arguments, print, and import other commands
TOP_MODULES = (f"{PACKAGE}.report", f"{PACKAGE}.app", f"{PACKAGE}.commands")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
# Functions allowed over MAX_FUNCTION_LINES, each with why: "path:function" -> reason. Only flat
# tables (one entry a line, nothing to hold in mind) or a function that cannot be split.
LONG_FUNCTIONS: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def is_command(module: str) -> bool:
    """A `__main__` or group `cli` module, or one at the top (report, app, commands)."""
    parts = module.split(".")
    top = any(module == t or module.startswith(f"{t}.") for t in TOP_MODULES)
    return top or parts[-1] == "__main__" or (len(parts) >= 3 and parts[-1] == "cli")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, cache_dir=None, exclude_type_checking_imports=True)


# --------------------------------------------------------------------------------------
# Tests: imports
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_imports(module):
    importlib.import_module(module)


def test_imports_point_one_way(capsys):
    """import-linter's layers contract (pyproject.toml), on this source tree."""
    code = lint_imports(config_filename=str(PYPROJECT), no_cache=True, no_logo=True)
    assert code == 0, capsys.readouterr().out


def test_the_layers_contract_sees_every_kind_of_import(tmp_path, monkeypatch, capsys):
    """Module-level, function-level and `__main__`-guard imports break the contract; a
    TYPE_CHECKING import does not (a throwaway package with the same settings)."""
    package = tmp_path / "layered"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("X = 1\n")
    (package / "high.py").write_text("from layered import low\n")
    config = tmp_path / "contract.toml"
    config.write_text(
        textwrap.dedent(
            """
            [tool.importlinter]
            root_package = "layered"
            exclude_type_checking_imports = true
            [[tool.importlinter.contracts]]
            name = "one way"
            type = "layers"
            layers = ["layered.high", "layered.low"]
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    upward = {
        "module level": "from layered import high\n",
        "in a function": "def f():\n    import layered.high\n",
        "under a __main__ guard": 'if __name__ == "__main__":\n    from layered import high\n',
    }
    for where, source in upward.items():
        (package / "low.py").write_text(source)
        assert lint_imports(config_filename=str(config), no_cache=True) == 1, where
    (package / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from layered import high\n"
    )
    assert lint_imports(config_filename=str(config), no_cache=True) == 0
    capsys.readouterr()


def cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[tuple[str, ...]]:
    """For each direct import a -> b among `modules` that b leads back to a: the loop."""
    found = []
    for importer in sorted(modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & modules):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back:
                found.append((importer, *back))
    return found


def test_no_import_cycles():
    every_import = grimp.build_graph(PACKAGE, cache_dir=None, exclude_type_checking_imports=False)
    found = cycles(every_import, set(MODULES))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_cycle_check_sees_a_circle_closed_by_a_type_checking_import(tmp_path, monkeypatch):
    """A throwaway package whose two modules import each other, one of them only under
    `if TYPE_CHECKING:`: the graph of every import has the circle; one without TYPE_CHECKING
    imports (import-linter's view) would miss it."""
    package = tmp_path / "circular"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fit.py").write_text("from circular.law import Law\n")
    (package / "law.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from circular.fit import Fit\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = {"circular.fit", "circular.law"}
    every_import = grimp.build_graph(
        "circular", cache_dir=None, exclude_type_checking_imports=False
    )
    assert cycles(every_import, modules) == [
        ("circular.fit", "circular.law", "circular.fit"),
        ("circular.law", "circular.fit", "circular.law"),
    ]
    runtime_only = grimp.build_graph("circular", cache_dir=None, exclude_type_checking_imports=True)
    assert cycles(runtime_only, modules) == []


def test_the_cycle_check_sees_a_loop(graph):
    graph = grimp.build_graph(PACKAGE, cache_dir=None)
    graph.add_import(importer=f"{PACKAGE}.errors", imported=f"{PACKAGE}.config")
    loop = cycles(graph, {f"{PACKAGE}.errors", f"{PACKAGE}.config", f"{PACKAGE}.fields"})
    assert (f"{PACKAGE}.config", f"{PACKAGE}.errors", f"{PACKAGE}.config") in loop


def entry_point_lines(tree: ast.Module) -> set[int]:
    """The lines of the body of each top-level `if __name__ == "__main__":` guard."""
    lines: set[int] = set()
    for node in tree.body:
        test = node.test if isinstance(node, ast.If) else None
        if (
            isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name)
            and test.left.id == "__name__"
            and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__"
        ):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def starts_its_groups_cli(graph: grimp.ImportGraph, module: str, target: str) -> bool:
    """`module` imports `target` only in its entry point, and `target` is its group's cli."""
    if target != f"{module.rsplit('.', 1)[0]}.cli":
        return False
    guard = entry_point_lines(ast.parse(MODULES[module].read_text(encoding="utf-8")))
    details = graph.get_import_details(importer=module, imported=target)
    return bool(details) and all(d["line_number"] in guard for d in details)


def test_only_the_body_of_a_top_level_main_guard_is_an_entry_point():
    source = textwrap.dedent(
        """
        import os
        def f():
            if __name__ == "__main__":
                import a
        if __name__ == "__main__":
            import b

            b.main()
        if __name__ != "__main__":
            import c
        """
    )
    assert entry_point_lines(ast.parse(source)) == {7, 9}  # `import b` and `b.main()`


def test_command_lines_sit_at_the_top(graph):
    """Only command modules parse arguments (argparse, smelt_interp.cli), and no other module
    imports a command module, except its group's cli from its own entry point (the body of its
    `if __name__ == "__main__":` guard)."""
    bad = []
    for module in sorted(MODULES):
        if is_command(module) or module == f"{PACKAGE}.cli":
            continue
        for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names.append(getattr(node, "module", None) or "")
                if "argparse" in names or f"{PACKAGE}.cli" in names:
                    bad.append(f"{module}:{node.lineno} parses arguments")
        for target in sorted(graph.find_modules_directly_imported_by(module)):
            if is_command(target) and not starts_its_groups_cli(graph, module, target):
                bad.append(f"{module} imports the command {target}")
    assert not bad, "command-line code outside the commands:\n" + "\n".join(bad)


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


def long_modules(paths: list[Path], limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """{path: lines} of each module longer than `limit` lines."""
    counts = {str(p): len(p.read_text(encoding="utf-8").splitlines()) for p in paths}
    return {p: n for p, n in counts.items() if n > limit}


def test_no_module_is_over_the_line_limit(tmp_path):
    found = long_modules(sorted(ROOT.rglob("*.py")))
    assert not found, f"modules over {MAX_MODULE_LINES} lines (split along jobs): {found}"
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    assert list(long_modules(sorted(tmp_path.glob("*.py")))) == [str(tmp_path / "long.py")]


def long_functions(
    paths: list[Path], base: Path = ROOT.parent, limit: int = MAX_FUNCTION_LINES
) -> dict[str, int]:
    """{"path:function": lines} of each function (methods and nested ones included) longer than
    `limit` lines, from its `def` (decorators excluded) to its last line; paths from `base`."""
    found = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found[f"{path.relative_to(base).as_posix()}:{node.name}"] = lines
    return found


def test_no_function_is_over_the_line_limit(tmp_path):
    found = long_functions(sorted(ROOT.rglob("*.py")))
    over = {name: n for name, n in found.items() if name not in LONG_FUNCTIONS}
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (split along steps): {over}"
    stale = set(LONG_FUNCTIONS) - set(found)
    assert not stale, f"allowed long functions that are short now (drop them): {stale}"
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    (tmp_path / "m.py").write_text(
        f"def short():\n{body}\n\nclass C:\n    def long(self):\n{textwrap.indent(body, '    ')}"
        "        return 1\n"
    )
    assert long_functions([tmp_path / "m.py"], tmp_path) == {"m.py:long": 81}


def top_parts() -> set[str]:
    """The package's top-level modules and packages, by name."""
    parts = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    return parts | {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}


def parts_left_out(text: str) -> set[str]:
    """The top-level modules and packages `text` does not name (as `name.py` or `name/`)."""
    return {name for name in top_parts() if f"{name}.py" not in text and f"{name}/" not in text}


def test_the_readme_layout_and_the_design_table_name_every_package():
    readme = (ROOT.parent / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout") : readme.index("Imports point one way")]
    design = (ROOT.parent / "docs" / "design.md").read_text(encoding="utf-8")
    start = design.index("## Where things go")
    table = design[start : design.index("\n## ", start + 1)]
    assert parts_left_out(layout) == set(), "README.md's Layout leaves these out"
    assert parts_left_out(table) == set(), "docs/design.md's 'Where things go' leaves these out"
    assert {"errors", "data"} <= parts_left_out("") and "data" not in parts_left_out("data/")
