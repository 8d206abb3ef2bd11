"""`load_source(spec)`: the one entry point that turns a spec (`dyck`, `code`, `arith`, a path,
or `DOMAIN=PATH`) into domain-tagged documents."""

from __future__ import annotations

import random
import re
from pathlib import Path

from smelt_interp.data.arith import arith_documents
from smelt_interp.data.code_source import code_documents
from smelt_interp.data.documents import Document
from smelt_interp.data.dyck import (
    EXAMPLE_SEP,
    DyckSpec,
    closing_sequence,
    format_example,
    sample_prefix,
)
from smelt_interp.data.split import split_of
from smelt_interp.data.user_files import DEFAULT_DOMAIN, path_documents
from smelt_interp.errors import DataError

BUILTIN_SOURCES = ("dyck", "code", "arith")
_NAMED_PATH = re.compile(r"^([A-Za-z_][\w-]*)=(.+)$")


def dyck_documents(
    n_docs: int, *, examples_per_doc: int = 8, seed: int = 0, spec: DyckSpec | None = None
) -> list[Document]:
    """`n_docs` documents of newline-separated Dyck examples. A document's split comes from
    its id and all its query inputs are drawn from that split, so the held-out documents
    share no input with training ones (and agree with dyck.make_dataset's split)."""
    if n_docs < 1 or examples_per_doc < 1:
        raise DataError(
            f"dyck needs n_docs, examples_per_doc >= 1, got {n_docs}, {examples_per_doc}"
        )
    spec = spec or DyckSpec()
    rng = random.Random(seed)
    docs = []
    for i in range(n_docs):
        doc_id = f"dyck/{seed}/{i}"
        prefixes = [sample_prefix(rng, spec, split_of(doc_id)) for _ in range(examples_per_doc)]
        text = "".join(format_example(p, closing_sequence(p)) + EXAMPLE_SEP for p in prefixes)
        docs.append(Document(doc_id, "dyck", text))
    return docs


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
            f"{spec}: no such file or directory (a source is {', '.join(BUILTIN_SOURCES)}, a path, or DOMAIN=PATH)"
        )
    return path_documents(spec, domain=DEFAULT_DOMAIN)
