"""Generated arithmetic: lines like `12+345=357`, `907-4512=-3605`, `38*61=2318`.

A document is a block of lines. Its split comes from its id, and each of its problems is drawn
from the same split (by a hash of the problem), so no problem is shared between splits."""

from __future__ import annotations

import random

from smelt_interp.data.documents import Document
from smelt_interp.data.split import Split, split_of
from smelt_interp.errors import DataError

OPS = "+-*"


def _operand(rng: random.Random, max_digits: int) -> int:
    digits = rng.randint(1, max_digits)
    return rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10**digits)


def arith_problem(rng: random.Random, max_digits: int = 4, split: Split | None = None) -> str:
    """One `a<op>b=c` line (no newline) from `split` when given."""
    while True:
        a, b, op = _operand(rng, max_digits), _operand(rng, max_digits), rng.choice(OPS)
        lhs = f"{a}{op}{b}"
        if split is None or split_of("arith:" + lhs) == split:
            value = a + b if op == "+" else a - b if op == "-" else a * b
            return f"{lhs}={value}"


def arith_documents(
    n_docs: int, *, lines_per_doc: int = 16, max_digits: int = 4, seed: int = 0
) -> list[Document]:
    """`n_docs` documents of `lines_per_doc` newline-terminated problems."""
    if n_docs < 1 or lines_per_doc < 1 or max_digits < 1:
        raise DataError(
            f"arith needs n_docs, lines_per_doc, max_digits >= 1, got {n_docs}, {lines_per_doc}, {max_digits}"
        )
    rng = random.Random(seed)
    docs = []
    for i in range(n_docs):
        doc_id = f"arith/{seed}/{i}"
        split = split_of(doc_id)
        text = "".join(arith_problem(rng, max_digits, split) + "\n" for _ in range(lines_per_doc))
        docs.append(Document(doc_id, "arith", text))
    return docs
