"""`load_source(spec)`: the one entry point that turns a spec into domain-tagged documents. The
built-in sources (`BUILTIN_SOURCES`) are generated or read here: Dyck examples, arithmetic and
real Python source; user text (a path, or `DOMAIN=PATH`) is read by `user_files`.

Each document's split comes from its id; generated documents draw every item from that split
(by a hash of the item), so no Dyck input or arithmetic problem is shared between splits."""

from __future__ import annotations

import os
import random
import re
import sysconfig
from pathlib import Path

from smelt_interp.data.documents import Document, Split, split_of
from smelt_interp.data.dyck import (
    EXAMPLE_SEP,
    DyckSpec,
    closing_sequence,
    format_example,
    sample_prefix,
)
from smelt_interp.data.user_files import DEFAULT_DOMAIN, path_documents
from smelt_interp.errors import DataError

BUILTIN_SOURCES = ("dyck", "code", "arith")
ARITH_OPS = "+-*"
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
_NAMED_PATH = re.compile(r"^([A-Za-z_][\w-]*)=(.+)$")


def _check_counts(source: str, **counts: int) -> None:
    if any(n < 1 for n in counts.values()):
        raise DataError(
            f"{source} needs {', '.join(counts)} >= 1, got {', '.join(map(str, counts.values()))}"
        )


# ----- dyck: in-context completion examples -------------------------------------------------
def dyck_documents(
    n_docs: int, *, examples_per_doc: int = 8, seed: int = 0, spec: DyckSpec | None = None
) -> list[Document]:
    """`n_docs` documents of newline-separated Dyck examples. A document's split comes from
    its id and all its query inputs are drawn from that split, so the held-out documents
    share no input with training ones (and agree with dyck.make_dataset's split)."""
    _check_counts("dyck", n_docs=n_docs, examples_per_doc=examples_per_doc)
    spec = spec or DyckSpec()
    rng = random.Random(seed)
    docs = []
    for i in range(n_docs):
        doc_id = f"dyck/{seed}/{i}"
        prefixes = [sample_prefix(rng, spec, split_of(doc_id)) for _ in range(examples_per_doc)]
        text = "".join(format_example(p, closing_sequence(p)) + EXAMPLE_SEP for p in prefixes)
        docs.append(Document(doc_id, "dyck", text))
    return docs


# ----- arith: lines like `12+345=357`, `907-4512=-3605`, `38*61=2318` -----------------------
def _operand(rng: random.Random, max_digits: int) -> int:
    digits = rng.randint(1, max_digits)
    return rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10**digits)


def arith_problem(rng: random.Random, max_digits: int = 4, split: Split | None = None) -> str:
    """One `a<op>b=c` line (no newline) from `split` when given."""
    while True:
        a, b, op = _operand(rng, max_digits), _operand(rng, max_digits), rng.choice(ARITH_OPS)
        lhs = f"{a}{op}{b}"
        if split is None or split_of("arith:" + lhs) == split:
            value = a + b if op == "+" else a - b if op == "-" else a * b
            return f"{lhs}={value}"


def arith_documents(
    n_docs: int, *, lines_per_doc: int = 16, max_digits: int = 4, seed: int = 0
) -> list[Document]:
    """`n_docs` documents of `lines_per_doc` newline-terminated problems."""
    _check_counts("arith", n_docs=n_docs, lines_per_doc=lines_per_doc, max_digits=max_digits)
    rng = random.Random(seed)
    docs = []
    for i in range(n_docs):
        doc_id = f"arith/{seed}/{i}"
        split = split_of(doc_id)
        text = "".join(arith_problem(rng, max_digits, split) + "\n" for _ in range(lines_per_doc))
        docs.append(Document(doc_id, "arith", text))
    return docs


# ----- code: the running interpreter's standard library -------------------------------------
def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def code_documents(
    max_bytes: int = 2_000_000, root: str | os.PathLike | None = None
) -> list[Document]:
    """Non-empty UTF-8 *.py files under `root` (default: the stdlib), in a fixed order (sorted
    directory walk), until `max_bytes` is reached; ids are `stdlib/<path relative to the root>`.
    Files that are not UTF-8 are skipped (the stdlib holds a few deliberate Latin-1 test files)."""
    base = Path(root) if root is not None else stdlib_root()
    if not base.is_dir():
        raise DataError(f"{base}: Python source directory not found")
    docs: list[Document] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if total >= max_bytes:
                return docs
            if not name.endswith(".py"):
                continue
            path = Path(dirpath) / name
            try:
                text = path.read_bytes().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if text.strip():
                docs.append(Document("stdlib/" + path.relative_to(base).as_posix(), "code", text))
                total += len(text.encode("utf-8"))
    if not docs:
        raise DataError(f"{base}: no Python source files found")
    return docs


# ----- the entry point ----------------------------------------------------------------------
def source_path(spec: str) -> Path | None:
    """The file or folder `spec` reads (see load_source), None for a built-in source: what a
    command's outputs must not overwrite."""
    if spec in BUILTIN_SOURCES:
        return None
    named = _NAMED_PATH.match(spec)
    return Path(named.group(2)) if named and not Path(spec).exists() else Path(spec)


def load_source(
    spec: str, *, seed: int = 0, n_docs: int = 2000, max_bytes: int = 2_000_000
) -> list[Document]:
    """Documents for `spec`: 'dyck' / 'arith' (`n_docs` generated documents from `seed`),
    'code' (stdlib Python up to `max_bytes`), a PATH (file, folder or .jsonl; domain 'text'
    unless a JSONL line sets one) or DOMAIN=PATH. Bad input raises a one-line DataError."""
    if not isinstance(spec, str) or not spec.strip():
        raise DataError(f"empty data source spec; expected {', '.join(BUILTIN_SOURCES)} or a path")
    if spec == "dyck":
        return dyck_documents(n_docs, seed=seed)
    if spec == "arith":
        return arith_documents(n_docs, seed=seed)
    if spec == "code":
        return code_documents(max_bytes)
    named = _NAMED_PATH.match(spec)
    if named and not Path(spec).exists():
        return path_documents(named.group(2), domain=named.group(1))
    if not Path(spec).exists():
        raise DataError(
            f"{spec}: no such file or directory "
            f"(a source is {', '.join(BUILTIN_SOURCES)}, a path, or DOMAIN=PATH)"
        )
    return path_documents(spec, domain=DEFAULT_DOMAIN)
