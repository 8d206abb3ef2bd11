"""measure/ is the one engine for attention statistics: no function outside smelt_interp/measure
computes an attention mass or a chance level. An AST check over every other module flags

- a chance level: a division by `(x + 1)` (uniform attention gives a query at position q
  1 / (q + 1) of its attention per key), and
- an attention mass: a BOS column read off attention weights (`pattern[..., 0]`), or a sum or
  mean over a subscript of them (`weights[:, q, keys].sum(-1)`),

where attention weights are a name that says so (pattern, weights, rows, attn, probs). The
check is shown to catch planted violations, among them the forms the probes and pages used
before the statistics moved into measure/."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import smelt_interp

PACKAGE = Path(smelt_interp.__file__).parent
ENGINE = PACKAGE / "measure"
WEIGHTS = re.compile(r"(^|_)(pattern|patterns|weights|rows|attn|attention|probs|p)($|_)")


def _is_one(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (1, 1.0) and node.value is not True


def _plus_one(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add)
        and (_is_one(node.left) or _is_one(node.right))
    )


def _weights_name(node: ast.AST) -> str | None:
    """The name of attention weights a subscript reads (`p`, `self.pattern(...)`, ...)."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Call):
        node = node.func
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return name if name and WEIGHTS.search(name) else None


def _last_index(sub: ast.Subscript) -> ast.AST:
    index = sub.slice
    return index.elts[-1] if isinstance(index, ast.Tuple) and index.elts else index


def violations(source: str, where: str = "<source>") -> list[str]:
    """`where:line function: what` for each statistic computed in a function of `source`."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            what = None
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Div)
                and _plus_one(node.right)
            ):
                what = "a chance level (a division by x + 1)"
            elif (
                isinstance(node, ast.Subscript)
                and isinstance(node.ctx, ast.Load)  # `rows[:, 0] = BOS_ID` writes, reads none
                and isinstance(node.slice, ast.Tuple)
                and _weights_name(node)
                and isinstance(_last_index(node), ast.Constant)
                and _last_index(node).value == 0
            ):
                what = f"a BOS column of {_weights_name(node)}"
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("sum", "mean")
                and isinstance(node.func.value, ast.Subscript)
                and _weights_name(node.func.value)
            ):
                what = f"an attention mass ({_weights_name(node.func.value)}[...].{node.func.attr})"
            if what:
                found.append(f"{where}:{node.lineno} {fn.name}: {what}")
    return found


def _outside_engine() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if ENGINE not in p.parents)


def test_no_module_outside_measure_computes_an_attention_statistic():
    found = []
    for path in _outside_engine():
        found += violations(path.read_text(), str(path.relative_to(PACKAGE)))
    assert not found, "ask smelt_interp.measure instead:\n" + "\n".join(found)


def test_the_engine_itself_is_what_the_check_sees():
    """The check is not blind: measure/ holds the statistics, so run over it, it finds them."""
    found = [v for p in sorted(ENGINE.rglob("*.py")) for v in violations(p.read_text(), p.name)]
    assert any("chance level" in v for v in found)
    assert any("BOS column" in v or "attention mass" in v for v in found)


PLANTED = {
    # the sink probe's reference level before it moved into measure.levels
    "uniform_level": """
def uniform_level(lengths, window=None):
    total, count = 0.0, 0
    for n in lengths.tolist():
        total += sum(1.0 / (i + 1) for i in range(1, n))
        count += max(n - 1, 0)
    return total / count
""",
    # the dashboard's per-prompt BOS share
    "bos_share": """
def bos_share(self, layer, visit):
    p = self.pattern(layer, visit)
    return p[:, 1:, 0].mean(axis=1)
""",
    # the recall page's demonstration mass
    "demo_mass": """
def demo_mass(weights, ex):
    return np.mean([weights[:, q, ex.demos[q]].sum(axis=-1) for q in ex.answer], axis=0)
""",
    # a chance level written with numpy
    "levels": """
def levels(n):
    return float(np.mean(1.0 / (np.arange(1, n) + 1.0)))
""",
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_statistic_is_caught(name):
    found = violations(PLANTED[name])
    assert found and all(f" {name}: " in v for v in found), found


def test_statistics_asked_of_measure_pass():
    asked = """
def view(run, lengths):
    share = pattern_bos_share(run.pattern(0, 0))
    return share / (len(lengths) + 2), uniform_bos(lengths)
"""
    assert violations(asked) == []
