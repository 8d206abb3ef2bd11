"""Real Python source: the standard library of the running interpreter, read in a fixed
order (sorted directory walk) up to a byte budget."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

from smelt_interp.data.documents import Document
from smelt_interp.errors import DataError

SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def code_documents(
    max_bytes: int = 2_000_000, root: str | os.PathLike | None = None
) -> list[Document]:
    """Non-empty UTF-8 *.py files under `root` (default: the stdlib) until `max_bytes` is
    reached; ids are `stdlib/<path relative to the root>`. Files that are not UTF-8 are skipped (the
    stdlib holds a few deliberate Latin-1 test files)."""
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
