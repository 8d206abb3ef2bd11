"""The sources `data prepare` reads: text files, folders, JSONL and Parquet, as documents.

A source is a text file (one document), a folder (its text, JSONL and Parquet files, recursively,
in sorted order), a JSONL file (one document per line: a string `text`, optionally `domain` and
`id`) or a Parquet file (one document per row of its `text` column, read in record batches),
each optionally tagged `DOMAIN=PATH` (else domain `text`).

Every file is read as an input (files.open_input: a FIFO, device or socket, named or found in a
folder, is refused before anything waits on it), a JSONL line is at most MAX_LINE_BYTES (one
line is held, parsed and tokenized whole) and parsed by files.parse_json. `fingerprint` names
what the sources hold (each file's path, size and modification time), so a resumed preparation
can tell that they are the ones it began with."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from smelt_interp.data.bpe import check_encodable
from smelt_interp.data.documents import Document
from smelt_interp.data.user_files import DEFAULT_DOMAIN, MAX_FILE_BYTES, jsonl_record
from smelt_interp.errors import DataError, TokenizerError
from smelt_interp.files import open_input, read_input_bytes

SOURCE_SUFFIXES = (".txt", ".md", ".rst", ".py", ".jsonl", ".parquet")
TEXT_COLUMN = "text"
PARQUET_BATCH_ROWS = 1024
MAX_LINE_BYTES = 16 * 2**20  # one JSONL or Parquet document: tokenizing it takes ~20x this
MAX_STREAM_BYTES = 1 << 40  # a JSONL or Parquet file is streamed, never held whole
# The domains the trainer generates itself: a prepared domain of one of these names would be
# replaced by the generated rows, so none is taken.
GENERATED_DOMAINS = ("dyck", "trigger", "assoc_recall", "computed_recall")
_DOMAIN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def check_domain(domain: object, where: str) -> str:
    """`domain` when it is a usable domain name: letters, digits, '_' and '-', and not the name
    of a generated task; else a DataError naming `where`."""
    if not isinstance(domain, str) or not domain or not set(domain) <= _DOMAIN_CHARS:
        raise DataError(f"{where}: a domain is letters, digits, '_' and '-'")
    if domain in GENERATED_DOMAINS:
        raise DataError(
            f"{where}: domain {domain!r} is the name of a task the trainer generates, whose rows "
            f"would replace these documents; name the domain otherwise (e.g. {domain}_text)"
        )
    return domain


def _regular(path: Path) -> None:
    """Refuse anything but a regular file (a FIFO would block, a device never end)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise DataError(f"{path}: not a regular file (a device, FIFO or socket is not read)")


@dataclass(frozen=True)
class Source:
    """One input path and the domain its documents get (a JSONL line may name its own)."""

    path: Path
    domain: str

    @classmethod
    def parse(cls, spec: str) -> Source:
        """PATH or DOMAIN=PATH (an existing path with '=' in its name stays a path)."""
        domain, sep, rest = spec.partition("=")
        if sep and not Path(spec).exists():
            check_domain(domain, spec)
            path = Path(rest)
        else:
            domain, path = DEFAULT_DOMAIN, Path(spec)
        if not path.exists():
            raise DataError(f"{path}: no such file or directory")
        _regular(path)
        return cls(path, domain)

    def files(self) -> list[tuple[Path, str]]:
        """(file, id prefix) pairs: the file itself, or a folder's source files, sorted; a
        source-named entry of a folder that is not a regular file is refused."""
        if not self.path.is_dir():
            return [(self.path, self.path.name)]
        out = []
        for dirpath, dirnames, filenames in os.walk(self.path):
            dirnames[:] = sorted(
                d for d in dirnames if not d.startswith(".") and d != "__pycache__"
            )
            for name in sorted(filenames):
                if name.endswith(SOURCE_SUFFIXES) and not name.startswith("."):
                    f = Path(dirpath) / name
                    _regular(f)
                    out.append((f, f.relative_to(self.path).as_posix()))
        if not out:
            raise DataError(f"{self.path}: no {'/'.join(SOURCE_SUFFIXES)} files")
        return out


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(number, bytes) of each line, none longer than MAX_LINE_BYTES (read in bounded pieces, so
    a file without newlines is refused, not held)."""
    with open_input(path, MAX_STREAM_BYTES, DataError, "source file") as fh:
        lineno = 0
        while raw := fh.readline(MAX_LINE_BYTES + 1):
            lineno += 1
            if len(raw) > MAX_LINE_BYTES:
                raise DataError(
                    f"{path}:{lineno}: a line longer than {MAX_LINE_BYTES >> 20} MiB, the most "
                    f"one document may take; split the document"
                )
            yield lineno, raw


def _jsonl(path: Path, prefix: str, domain: str) -> Iterator[Document]:
    for lineno, raw in _lines(path):
        where = f"{path}:{lineno}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise DataError(f"{where}: not UTF-8 text") from None
        if not line.strip():
            continue
        record = jsonl_record(line, where)
        try:  # a JSON escape can spell a lone surrogate, which no tokenizer encodes
            check_encodable(record["text"])
        except TokenizerError as exc:
            raise DataError(f"{where}: 'text' {exc}") from None
        dom = check_domain(record.get("domain", domain), f"{where}: 'domain'")
        doc_id = record.get("id")
        yield Document(f"{prefix}:{doc_id if doc_id is not None else lineno}", dom, record["text"])


def _arrow_line(exc: BaseException) -> str:
    """An Arrow error's text as one line (its messages span several)."""
    return " ".join(str(exc).split())[:200]


def _parquet(path: Path, prefix: str, domain: str) -> Iterator[Document]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open_input(path, MAX_STREAM_BYTES, DataError, "source file") as fh:
        try:
            pf = pq.ParquetFile(fh)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{path}: not a readable Parquet file ({_arrow_line(exc)})") from None
        names = pf.schema_arrow.names
        if TEXT_COLUMN not in names:
            raise DataError(
                f"{path}: no '{TEXT_COLUMN}' column (it has {', '.join(names[:20]) or 'none'})"
            )
        kind = pf.schema_arrow.field(TEXT_COLUMN).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise DataError(f"{path}: column '{TEXT_COLUMN}' holds {kind}, not strings")
        row = 0
        try:
            for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[TEXT_COLUMN]):
                for text in batch.column(0).to_pylist():
                    if text is not None and len(text) > MAX_LINE_BYTES:  # as a JSONL line's
                        raise DataError(
                            f"{path}: row {row} holds a document longer than "
                            f"{MAX_LINE_BYTES >> 20} MiB, the most one may take; split it"
                        )
                    yield Document(f"{prefix}:{row}", domain, text if text is not None else "")
                    row += 1
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:  # a page's bytes too
            raise DataError(f"{path}: damaged Parquet file ({_arrow_line(exc)})") from None


def _text_file(path: Path, prefix: str, domain: str) -> Iterator[Document]:
    raw = read_input_bytes(path, MAX_FILE_BYTES, DataError, "source file (split it, or use JSONL)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None
    yield Document(prefix, domain, text)


def iter_documents(sources: Sequence[Source]) -> Iterator[Document]:
    """Every document of every source, in a fixed order."""
    for source in sources:
        for path, prefix in source.files():
            if path.suffix == ".jsonl":
                yield from _jsonl(path, prefix, source.domain)
            elif path.suffix == ".parquet":
                yield from _parquet(path, prefix, source.domain)
            else:
                yield from _text_file(path, prefix, source.domain)


def source_bytes(sources: Sequence[Source]) -> int:
    """The total size of the source files (the progress bar's total)."""
    return sum(path.stat().st_size for s in sources for path, _ in s.files())


def fingerprint(sources: Sequence[Source]) -> list[list[str | int]]:
    """[path, size, modification time in ns] of every source file, in reading order: what a
    preparation records, so a resume can refuse sources that changed since it began (a file
    added, removed, grown or rewritten would shift which documents the finished shards hold)."""
    out: list[list[str | int]] = []
    for s in sources:
        for path, _ in s.files():
            st = path.stat()
            out.append([str(path.resolve()), st.st_size, st.st_mtime_ns])
    return out
