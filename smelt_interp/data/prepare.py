"""The computation of `python -m smelt_interp.data prepare`: text sources in, token shards out.

A source is a text file (one document), a folder (its text, JSONL and Parquet files, recursively,
in sorted order), a JSONL file (one document per line: a string `text`, optionally `domain` and
`id`) or a Parquet file (one document per row of its `text` column, read in record batches),
each optionally tagged `DOMAIN=PATH` (else domain `text`). Documents stream in a fixed order;
each is held out or trained on by a hash of its id (documents.split_of), tokenized in batches
(the `tokenizers` library's threads encode a batch in parallel) and appended, BOS first, to the
open shard of its (domain, split) (data.shards has the format). Memory holds one batch of text
and each open shard's document index, never the corpus.

After each finished shard the manifest is rewritten atomically, so a preparation killed midway
resumes by shard: the same command skips the documents that finished shards hold and rewrites
only the unfinished ones."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from smelt_interp.data.bpe import (
    BpeTokenizer,
    Tokenizer,
    check_encodable,
    read_tokenizer,
    resolve_tokenizer,
    tokenizer_hash,
    tokenizer_json,
)
from smelt_interp.data.documents import Document, split_of
from smelt_interp.data.shards import (
    FORMAT_VERSION,
    MANIFEST,
    TOKENIZER_FILE,
    ShardWriter,
    shard_name,
)
from smelt_interp.data.user_files import DEFAULT_DOMAIN, MAX_FILE_BYTES
from smelt_interp.errors import DataError, TokenizerError
from smelt_interp.files import atomic_write_text, json_text

SOURCE_SUFFIXES = (".txt", ".md", ".rst", ".py", ".jsonl", ".parquet")
TEXT_COLUMN = "text"
DEFAULT_SHARD_TOKENS = 1 << 26  # 128 MiB of uint16 ids a shard
BATCH_BYTES = 4 << 20  # text tokenized at once
PARQUET_BATCH_ROWS = 1024
_DOMAIN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


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
            if not domain or not set(domain) <= _DOMAIN_CHARS:
                raise DataError(f"{spec}: a domain is letters, digits, '_' and '-'")
            path = Path(rest)
        else:
            domain, path = DEFAULT_DOMAIN, Path(spec)
        if not path.exists():
            raise DataError(f"{path}: no such file or directory")
        return cls(path, domain)

    def files(self) -> list[tuple[Path, str]]:
        """(file, id prefix) pairs: the file itself, or a folder's source files, sorted."""
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
                    out.append((f, f.relative_to(self.path).as_posix()))
        if not out:
            raise DataError(f"{self.path}: no {'/'.join(SOURCE_SUFFIXES)} files")
        return out


def _jsonl(path: Path, prefix: str, domain: str) -> Iterator[Document]:
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{where}: not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise DataError(f"{where}: expected a JSON object with a string 'text' field")
            try:  # a JSON escape can spell a lone surrogate, which no tokenizer encodes
                check_encodable(record["text"])
            except TokenizerError as exc:
                raise DataError(f"{where}: 'text' {exc}") from None
            dom = record.get("domain", domain)
            if not isinstance(dom, str) or not dom or not set(dom) <= _DOMAIN_CHARS:
                raise DataError(f"{where}: 'domain' must be letters, digits, '_' and '-'")
            doc_id = record.get("id")
            yield Document(
                f"{prefix}:{doc_id if doc_id is not None else lineno}", dom, record["text"]
            )


def _parquet(path: Path, prefix: str, domain: str) -> Iterator[Document]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({str(exc)[:200]})") from None
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
                yield Document(f"{prefix}:{row}", domain, text if text is not None else "")
                row += 1
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: damaged Parquet file ({str(exc)[:200]})") from None


def _text_file(path: Path, prefix: str, domain: str) -> Iterator[Document]:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise DataError(
                f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB; split it or use JSONL"
            )
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None
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


def check_out_dir(out: Path, sources: Sequence[Source]) -> None:
    """Refuse an output folder inside a source (its shards would be read back as input) or a
    source inside the output."""
    target = out.resolve()
    for s in sources:
        src = s.path.resolve()
        if target == src or src in target.parents or target in src.parents:
            raise DataError(f"--out {out} lies inside the source {s.path} (or holds it)")
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out}: a file, not a folder")


@dataclass
class Manifest:
    """What a prepared folder holds; rewritten after each finished shard."""

    sources: list[str]
    tokenizer_hash: str
    shard_tokens: int
    shards: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = False
    version: int = FORMAT_VERSION

    def write(self, out: Path) -> None:
        atomic_write_text(out / MANIFEST, json_text(self.__dict__))

    @classmethod
    def read(cls, out: Path) -> Manifest | None:
        path = out / MANIFEST
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(**data)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError) as exc:
            raise DataError(f"{path}: damaged manifest ({str(exc)[:120]})") from None

    def done_docs(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for s in self.shards:
            key = (s["domain"], s["split"])
            out[key] = out.get(key, 0) + s["docs"]
        return out


@dataclass
class PrepareStats:
    """What one prepare call did (the command prints it)."""

    docs: int = 0
    tokens: int = 0
    bytes: int = 0
    skipped_docs: int = 0
    seconds: float = 0.0
    shards: int = 0
    by_domain: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _encode(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Each text's ids with BOS in front."""
    if isinstance(tokenizer, BpeTokenizer):
        return [
            np.array([tokenizer.bos_id, *ids], dtype=np.int64)
            for ids in tokenizer.encode_batch(texts)
        ]
    out = []
    for text in texts:
        body = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
        out.append(np.concatenate([[tokenizer.bos_id], body]).astype(np.int64))
    return out


def _batches(docs: Iterator[Document], limit: int) -> Iterator[list[Document]]:
    batch: list[Document] = []
    size = 0
    for doc in docs:
        batch.append(doc)
        size += len(doc.text)
        if size >= limit:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _check_text(doc: Document) -> None:
    try:
        doc.text.encode("utf-8")
    except UnicodeEncodeError:
        raise DataError(f"{doc.id}: text holds a lone surrogate; not valid Unicode") from None


def prepare(
    specs: Sequence[str],
    out: str | os.PathLike[str],
    tokenizer_spec: str = "bytes",
    *,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    progress: Callable[[int, int], None] | None = None,
) -> PrepareStats:
    """Prepare `specs` into the folder `out` (see the module docstring); `progress(bytes,
    tokens)` is called after each batch. Returns what was done."""
    if not specs:
        raise DataError("prepare needs at least one source")
    if shard_tokens < 1:
        raise DataError(f"shard_tokens must be >= 1, got {shard_tokens}")
    sources = [Source.parse(s) for s in specs]
    out = Path(out)
    check_out_dir(out, sources)
    spec_names = [f"{s.domain}={s.path.resolve()}" for s in sources]
    manifest = Manifest.read(out) if out.is_dir() else None
    if manifest is None and out.is_dir() and any(out.iterdir()):
        raise DataError(f"--out {out}: not empty and not a prepared folder; choose a new folder")
    tok_path = out / TOKENIZER_FILE
    if manifest is not None:
        if manifest.sources != spec_names or manifest.shard_tokens != shard_tokens:
            raise DataError(
                f"--out {out}: holds a preparation of other sources or shard size; "
                f"choose a new folder"
            )
        tokenizer = read_tokenizer(tok_path)
        if tokenizer_hash(tokenizer_json(tokenizer)) != manifest.tokenizer_hash:
            raise DataError(f"{tok_path}: does not match the manifest's tokenizer hash")
        if tokenizer_spec not in ("bytes",) and not tokenizer_spec.startswith("bpe:"):
            given = read_tokenizer(tokenizer_spec)
            if tokenizer_json(given) != tokenizer_json(tokenizer):
                raise DataError(
                    f"--out {out}: prepared with another tokenizer; choose a new folder"
                )
        if manifest.complete:
            return PrepareStats()
    else:
        tokenizer = resolve_tokenizer(
            tokenizer_spec, lambda: (d.text for d in iter_documents(sources))
        )
        out.mkdir(parents=True, exist_ok=True)
        text = tokenizer_json(tokenizer)
        atomic_write_text(tok_path, text)
        manifest = Manifest(spec_names, tokenizer_hash(text), shard_tokens)
        manifest.write(out)
    for stale in out.glob(".*.part"):
        stale.unlink()
    return _write_shards(out, sources, tokenizer, manifest, progress)


def _write_shards(
    out: Path,
    sources: Sequence[Source],
    tokenizer: Tokenizer,
    manifest: Manifest,
    progress: Callable[[int, int], None] | None,
) -> PrepareStats:
    stats = PrepareStats()
    start = time.perf_counter()
    done = manifest.done_docs()
    seen: dict[tuple[str, str], int] = {}
    count = {
        key: sum(1 for s in manifest.shards if (s["domain"], s["split"]) == key) for key in done
    }
    writers: dict[tuple[str, str], ShardWriter] = {}

    def finish(key: tuple[str, str]) -> None:
        writer = writers.pop(key)
        header = writer.close()
        manifest.shards.append(
            {
                "file": writer.path.name,
                "domain": key[0],
                "split": key[1],
                "tokens": header.n_tokens,
                "docs": header.n_docs,
            }
        )
        count[key] = count.get(key, 0) + 1
        stats.shards += 1
        manifest.write(out)

    def todo(doc: Document) -> bool:
        key = (doc.domain, split_of(doc.id))
        seen[key] = seen.get(key, 0) + 1
        return seen[key] > done.get(key, 0)

    try:
        for batch in _batches(iter_documents(sources), BATCH_BYTES):
            size = sum(len(d.text) for d in batch)
            fresh = [d for d in batch if todo(d)]
            stats.skipped_docs += len(batch) - len(fresh)
            for doc in fresh:
                _check_text(doc)
            n_tokens = 0
            for doc, ids in zip(fresh, _encode(tokenizer, [d.text for d in fresh]), strict=True):
                key = (doc.domain, split_of(doc.id))
                if key not in writers:
                    writers[key] = ShardWriter(
                        out / shard_name(*key, count.get(key, 0)),
                        vocab_size=tokenizer.vocab_size,
                        bos_id=tokenizer.bos_id,
                        tokenizer_hash=manifest.tokenizer_hash,
                        domain=key[0],
                        split=key[1],
                    )
                writers[key].add(ids)
                n_tokens += len(ids)
                per = stats.by_domain.setdefault(f"{key[0]}/{key[1]}", {"docs": 0, "tokens": 0})
                per["docs"] += 1
                per["tokens"] += len(ids)
                if writers[key].n_tokens >= manifest.shard_tokens:
                    finish(key)
            stats.docs += len(fresh)
            stats.tokens += n_tokens
            stats.bytes += size
            if progress is not None:
                progress(size, n_tokens)
        for key in sorted(writers):
            finish(key)
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    if not manifest.shards:
        raise DataError("the sources hold no documents")
    manifest.complete = True
    manifest.write(out)
    stats.seconds = time.perf_counter() - start
    return stats
