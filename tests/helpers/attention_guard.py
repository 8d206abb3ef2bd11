"""An AST check that finds arithmetic over attention outside smelt_interp/measure: any reduction
(a sum, mean, einsum, matmul or division, in any spelling) of a value that holds attention,
and the two statistics that need no reduction to spot (a chance level written as a division
by `x + 1`, a BOS column read off attention weights).

What holds attention is followed through each function, in the order of its statements:

- a name or attribute that says so: pattern(s), attn, attention, column(s) (BOS columns),
  mass(es), sums, reference (uniform attention's sums), slot(s) (a learned sink's share);
- what a call of one of measure/'s attention functions returns (rows, columns, masses, sums);
- whatever is computed from, unpacked from, or iterated out of such a value, and an object a
  method fed such a value (`acc.add(key, column.sum(-1), n)` makes `acc` hold attention, so
  `acc.mean(key)` is a division of attention sums).

A pandas column of a results table (`heads["sink_mass"].mean()`) is a pooled result read,
not attention, and is left alone: summaries over heads of measure's pooled results are the
probes' job."""

from __future__ import annotations

import ast
import re

ATTENTION_NAME = re.compile(
    r"(^|_)(pattern|patterns|attn|attention|column|columns|mass|masses|sums|reference"
    r"|slot|slots)($|_)"
)
# measure/'s functions that return attention rows, columns, masses or their sums
ATTENTION_CALLS = frozenset(
    {
        "attention_rows",
        "qk_rows",
        "pattern_rows",
        "visit_rows",
        "uniform_rows",
        "causal_chunks",
        "row_chunks",
        "pattern",
        "bos_columns",
        "first_key_columns",
        "bos_column_sums",
        "grouped_mass",
        "key_set_mass",
        "visit_masses",
        "uniform_masses",
        "row_masses",
        "dyck_masses",
        "recall_masses",
        "topk_overlap_sum",
        "topk_overlap_rows",
    }
)
REDUCTIONS = frozenset(
    {
        "sum",
        "mean",
        "nansum",
        "nanmean",
        "average",
        "einsum",
        "matmul",
        "dot",
        "cumsum",
        "tensordot",
    }
)
SIZES = frozenset({"shape", "dtype", "device", "ndim", "size"})  # what a tensor's shape says
MODULES = frozenset({"torch", "np", "numpy", "math", "F"})  # torch.sum(x), np.mean(x), ...


def _name(node: ast.AST) -> str | None:
    """The last name of `x`, `a.b.x`, `x[...]`, `x(...)`."""
    while isinstance(node, ast.Subscript | ast.Call | ast.Starred):
        node = node.func if isinstance(node, ast.Call) else node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _is_table_column(node: ast.AST) -> bool:
    """`df["col"]`: a pandas column read by its name."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    )


def _is_module(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in MODULES


def _shown(node: ast.AST, width: int = 40) -> str:
    """The source of `node`, cut to `width` characters, for a finding's message."""
    text = ast.unparse(node)
    return text if len(text) <= width else text[: width - 3] + "..."


def _paired(target: ast.AST, value: ast.AST) -> list[tuple[str, ast.AST]]:
    """(name, the value it is bound to): a tuple unpacked from a tuple pairs element by
    element; anything else binds every name to the whole value."""
    if (
        isinstance(target, ast.Tuple | ast.List)
        and isinstance(value, ast.Tuple | ast.List)
        and len(target.elts) == len(value.elts)
    ):
        return [pair for t, v in zip(target.elts, value.elts) for pair in _paired(t, v)]
    return [(name, value) for name in _targets(target)]


def _targets(node: ast.AST) -> list[str]:
    """Names bound by an assignment target (tuples unpacked)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Tuple | ast.List):
        return [n for elt in node.elts for n in _targets(elt)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return []


class _Function(ast.NodeVisitor):
    """Walks one function's body in order, keeping the names that hold attention."""

    def __init__(self, where: str, fn: ast.AST) -> None:
        self.where, self.fn, self.held = where, fn, set[str]()
        self.found: list[str] = []

    def holds(self, node: ast.AST | None) -> bool:
        """Whether the value of `node` holds attention."""
        if node is None or _is_table_column(node):
            return False
        if isinstance(node, ast.Name):
            return node.id in self.held or bool(ATTENTION_NAME.search(node.id))
        if isinstance(node, ast.Attribute):
            if node.attr in SIZES:
                return False
            return bool(ATTENTION_NAME.search(node.attr)) or self.holds(node.value)
        if isinstance(node, ast.Call):
            if _name(node.func) in ATTENTION_CALLS:
                return True
            func = node.func
            if isinstance(func, ast.Attribute) and _is_module(func.value):
                return any(self.holds(a) for a in node.args)  # torch.stack(masses), np.asarray
            if isinstance(func, ast.Attribute) and func.attr not in ("get", "items"):
                return self.holds(func.value)  # x.double(), x.cpu(), x.sum(...)
            return False
        if isinstance(node, ast.Subscript):
            return self.holds(node.value)
        if isinstance(node, ast.BinOp):
            return self.holds(node.left) or self.holds(node.right)
        if isinstance(node, ast.UnaryOp):
            return self.holds(node.operand)
        if isinstance(node, ast.Tuple | ast.List):
            return any(self.holds(e) for e in node.elts)
        if isinstance(node, ast.GeneratorExp | ast.ListComp):  # sum(r for r in rows)
            return self.holds(node.elt) or any(self.holds(g.iter) for g in node.generators)
        if isinstance(node, ast.IfExp):
            return self.holds(node.body) or self.holds(node.orelse)
        return False

    def flag(self, node: ast.AST, what: str) -> None:
        name = getattr(self.fn, "name", "?")
        self.found.append(f"{self.where}:{node.lineno} {name}: {what}")

    # binding -----------------------------------------------------------------------------
    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        for target in node.targets:
            pairs = _paired(target, node.value)
            self.held.update(name for name, value in pairs if self.holds(value))

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        if node.value is not None and self.holds(node.value):
            self.held.update(_targets(node.target))

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.generic_visit(node)
        if self.holds(node.value) and isinstance(node.target, ast.Name):
            if isinstance(node.op, ast.Add):  # a running sum over attention
                self.flag(node, f"an attention sum ({node.target.id} += ...)")
            self.held.add(node.target.id)

    def visit_For(self, node: ast.For) -> None:
        if self.holds(node.iter):
            self.held.update(_targets(node.target))
        self.generic_visit(node)

    # what is flagged ---------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        func = node.func
        if not isinstance(func, ast.Attribute):
            if isinstance(func, ast.Name) and func.id == "sum" and any(map(self.holds, node.args)):
                self.flag(node, "an attention sum (sum(...))")
            return
        receiver = func.value
        module = _is_module(receiver)
        if func.attr in REDUCTIONS:
            if module and any(self.holds(a) for a in node.args):
                self.flag(node, f"an attention reduction ({_shown(func)})")
            elif not module and self.holds(receiver):
                self.flag(node, f"an attention reduction ({_shown(func)})")
        elif any(self.holds(a) for a in node.args) and isinstance(receiver, ast.Name):
            self.held.add(receiver.id)  # acc.add(key, mass, n): acc now holds attention sums

    def visit_BinOp(self, node: ast.BinOp) -> None:
        self.generic_visit(node)
        if isinstance(node.op, ast.Div) and _plus_one(node.right):
            self.flag(node, "a chance level (a division by x + 1)")
        elif isinstance(node.op, ast.Div | ast.FloorDiv | ast.MatMult) and (
            self.holds(node.left) or self.holds(node.right)
        ):
            op = "/" if isinstance(node.op, ast.Div | ast.FloorDiv) else "@"
            self.flag(node, f"arithmetic on attention ({_shown(node.left)} {op} ...)")

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self.generic_visit(node)
        index = node.slice
        last = index.elts[-1] if isinstance(index, ast.Tuple) and index.elts else None
        if (
            isinstance(node.ctx, ast.Load)
            and isinstance(last, ast.Constant)
            and last.value == 0
            and _reads_weights(node)
        ):
            self.flag(node, f"a BOS column of {_name(node)}")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node is self.fn:
            self.generic_visit(node)  # a nested function is checked on its own

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]


WEIGHTS = re.compile(r"(^|_)(pattern|patterns|weights|rows|attn|attention|probs|p)($|_)")


def _reads_weights(node: ast.Subscript) -> bool:
    name = _name(node)
    return bool(name and WEIGHTS.search(name) and "expert" not in name)


def _is_one(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (1, 1.0) and node.value is not True


def _plus_one(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add)
        and (_is_one(node.left) or _is_one(node.right))
    )


def violations(source: str, where: str = "<source>") -> list[str]:
    """`where:line function: what` for each piece of arithmetic over attention in a function
    of `source`."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            check = _Function(where, fn)
            if isinstance(fn, ast.Lambda):
                check.visit(fn.body)
            else:
                check.visit(fn)
            found += check.found
    return sorted(set(found), key=found.index)
