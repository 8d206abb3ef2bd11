"""Every reader of a user-named file goes through the checked-input path: the package holds no
direct `json.loads` / `json.load`, read-mode `open()`, `Path.read_text()` or `Path.read_bytes()`
outside smelt_interp.files, but for the calls listed here, each on something the program made
itself or on a system file, with the reason. A new reader that calls one directly (and would
hang on a FIFO, read /dev/zero until memory runs out, or print a RecursionError traceback for
JSON nested 100,000 deep) fails this test until it uses files.open_input / parse_json."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "smelt_interp"
CHECKED = "smelt_interp/files.py"  # the checked-input path itself
# (module, enclosing function, call): reads of what is not a user-named file
ALLOWED = {
    ("smelt_interp/probes/cli.py", "records", "json.loads"): "pandas' own to_json text",
    ("smelt_interp/probes/cli.py", "config_record", "json.loads"): "json.dumps of a dataclass",
    ("smelt_interp/analysis/downstream/compare.py", "to_json", "json.loads"): "pandas' to_json",
    ("smelt_interp/app/http_hardening.py", "declared_outputs", "json.loads"): "Dash's own ids",
    ("smelt_interp/data/sources.py", "code_documents", "read_bytes"): "Python's stdlib files",
    ("smelt_interp/machine.py", "memory_limit_bytes", "open"): "a cgroup file of the kernel's",
    ("smelt_interp/machine.py", "available_memory", "open"): "/proc/meminfo",
    ("smelt_interp/train/progress.py", "lock_held", "read_text"): "/proc/locks",
    ("smelt_interp/train/trainer.py", "keep_checkpoint", "open"): "the ckpt.pt it just wrote",
}
READ_METHODS = ("read_text", "read_bytes")


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name) and func.id == "open":
        return "open" if _read_mode(call) else None
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and func.value.id == "json":
            return f"json.{func.attr}" if func.attr in ("loads", "load") else None
        if func.attr in READ_METHODS:
            return func.attr
    return None


def _read_mode(call: ast.Call) -> bool:
    """Whether a builtin open() call reads (a write or append mode writes an output)."""
    mode = call.args[1] if len(call.args) > 1 else None
    mode = next((k.value for k in call.keywords if k.arg == "mode"), mode)
    if mode is None:
        return True
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return not any(c in mode.value for c in "wax")
    return True


def direct_reads() -> dict[tuple[str, str, str], int]:
    """{(module, enclosing function, call): line} of every direct read in the package."""
    found: dict[tuple[str, str, str], int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE.parent).as_posix()
        if module == CHECKED:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        stack: list[tuple[ast.AST, str]] = [(tree, "<module>")]
        while stack:
            node, where = stack.pop()
            for child in ast.iter_child_nodes(node):
                inner = where
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    inner = child.name
                if isinstance(child, ast.Call) and (name := _call_name(child)):
                    found.setdefault((module, where, name), child.lineno)
                stack.append((child, inner))
    return found


def test_no_direct_reads_of_user_files() -> None:
    unchecked = {key: line for key, line in direct_reads().items() if key not in ALLOWED}
    assert not unchecked, "read through smelt_interp.files instead:\n" + "\n".join(
        f"{module}:{line} in {where}(): {call}" for (module, where, call), line in unchecked.items()
    )


def test_the_allowed_reads_still_exist() -> None:
    """An allowance whose call is gone is stale: removed here too, so none is left to hide a
    new reader of the same name."""
    stale = set(ALLOWED) - set(direct_reads())
    assert not stale, stale


def test_the_guard_sees_each_kind_of_direct_read(tmp_path: Path) -> None:
    """The walker finds what it must: json.loads, json.load, a read-mode open (no mode, 'rb',
    mode='r'), read_text and read_bytes; and not a write-mode open."""
    source = (
        "import json\n"
        "def f(p):\n"
        "    json.loads(p)\n    json.load(p)\n    open(p)\n    open(p, 'rb')\n"
        "    open(p, mode='r')\n    p.read_text()\n    p.read_bytes()\n    open(p, 'w')\n"
    )
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    names = [name for c in calls if (name := _call_name(c))]
    assert sorted(names) == sorted(
        ["json.loads", "json.load", "open", "open", "open", "read_text", "read_bytes"]
    )
