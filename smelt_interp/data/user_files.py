"""User text: a file, a folder (recursively, known text suffixes) or JSONL (one document per
line with a string `text` field and an optional `domain`). Every problem raises DataError with
one line naming the file and what is wrong."""

from __future__ import annotations

import json
import os
from pathlib import Path

from smelt_interp.data.documents import Document
from smelt_interp.errors import DataError
from smelt_interp.files import parse_json, read_input_text

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".jsonl")
DEFAULT_DOMAIN = "text"
MAX_FILE_BYTES = 64 * 2**20  # the most read from any one file (/dev/zero never ends)


def _read_utf8(path: Path) -> str:
    """The text of a regular UTF-8 file of at most MAX_FILE_BYTES; a device, FIFO or socket is
    refused before anything is read from it (reading one may never end, or block)."""
    return read_input_text(path, MAX_FILE_BYTES, DataError, "data file")


def _check_encodable(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(
            f"{where}: text holds a lone surrogate {text[exc.start]!r}; not valid Unicode"
        ) from None


def jsonl_record(line: str, where: str) -> dict:
    """One JSONL line as a JSON object with a string `text` field (parsed by parse_json, so
    nesting or a number the parser cannot hold is one line too), else a DataError at `where`."""
    try:
        record = parse_json(line, where, DataError)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise DataError(f"{where}: expected a JSON object with a string 'text' field")
    return record


def _jsonl_documents(path: Path, doc_prefix: str, domain: str) -> list[Document]:
    docs = []
    for lineno, line in enumerate(_read_utf8(path).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        record = jsonl_record(line, where)
        dom = record.get("domain", domain)
        if not isinstance(dom, str) or not dom:
            raise DataError(f"{where}: 'domain' must be a non-empty string")
        _check_encodable(record["text"], where)
        if record["text"].strip():
            docs.append(Document(f"{doc_prefix}:{lineno}", dom, record["text"]))
    return docs


def _file_documents(path: Path, doc_id: str, domain: str) -> list[Document]:
    if path.suffix == ".jsonl":
        return _jsonl_documents(path, doc_id, domain)
    text = _read_utf8(path)
    return [Document(doc_id, domain, text)] if text.strip() else []


def _folder_files(root: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        files.extend(
            Path(dirpath) / f
            for f in sorted(filenames)
            if f.endswith(TEXT_SUFFIXES) and not f.startswith(".")
        )
    return files


def path_documents(path: str | os.PathLike, domain: str = DEFAULT_DOMAIN) -> list[Document]:
    """Documents from a file or folder. Ids are paths relative to the folder (or the file's
    name), so the train/held-out split survives moving the data."""
    root = Path(path)
    if not root.exists():
        raise DataError(f"{root}: no such file or directory")
    if root.is_dir():
        files = _folder_files(root)
        if not files:
            raise DataError(f"{root}: empty corpus (no {'/'.join(TEXT_SUFFIXES)} files)")
        docs = [
            d for f in files for d in _file_documents(f, f.relative_to(root).as_posix(), domain)
        ]
    else:
        docs = _file_documents(root, root.name, domain)
    if not docs:
        raise DataError(f"{root}: empty corpus (no non-empty documents)")
    return docs
