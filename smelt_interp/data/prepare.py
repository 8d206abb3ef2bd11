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
    read_tokenizer,
    resolve_tokenizer,
    tokenizer_hash,
    tokenizer_json,
)
from smelt_interp.data.documents import Document, split_of
from smelt_interp.data.prepare_sources import (
    Source,
    fingerprint,
    iter_documents,
    source_bytes,
)
from smelt_interp.data.shards import (
    FORMAT_VERSION,
    MANIFEST,
    TOKENIZER_FILE,
    ShardWriter,
    read_manifest,
    shard_name,
)
from smelt_interp.errors import DataError
from smelt_interp.files import atomic_write_text, json_text

__all__ = ["Manifest", "PrepareStats", "Source", "iter_documents", "prepare", "source_bytes"]
DEFAULT_SHARD_TOKENS = 1 << 26  # 128 MiB of uint16 ids a shard
BATCH_BYTES = 4 << 20  # text tokenized at once


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
    tokenizer_spec: str | None = None  # --tokenizer as given (bytes, bpe:N or a file)
    source_files: list[list[str | int]] | None = None  # prepare_sources.fingerprint

    def write(self, out: Path) -> None:
        atomic_write_text(out / MANIFEST, json_text(self.__dict__))

    @classmethod
    def read(cls, out: Path) -> Manifest | None:
        path = out / MANIFEST
        if not path.exists() and not path.is_symlink():
            return None
        data = read_manifest(path)
        try:
            return cls(**data)
        except TypeError as exc:
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
        _check_same_tokenizer(out, manifest, tokenizer_spec, tokenizer)
        if manifest.complete:
            return PrepareStats()
        _check_same_sources(out, manifest, sources)
    else:
        tokenizer = resolve_tokenizer(
            tokenizer_spec, lambda: (d.text for d in iter_documents(sources))
        )
        files = fingerprint(sources)  # before any document is read for the shards
        out.mkdir(parents=True, exist_ok=True)
        text = tokenizer_json(tokenizer)
        atomic_write_text(tok_path, text)
        manifest = Manifest(
            spec_names,
            tokenizer_hash(text),
            shard_tokens,
            tokenizer_spec=tokenizer_spec,
            source_files=files,
        )
        manifest.write(out)
    for stale in out.glob(".*.part"):
        stale.unlink()
    return _write_shards(out, sources, tokenizer, manifest, progress)


def _check_same_tokenizer(out: Path, manifest: Manifest, spec: str, tokenizer: Tokenizer) -> None:
    """Refuse a `--tokenizer` other than the one the folder was prepared with: its shards' ids
    mean other tokens (bytes and bpe:N are compared by the spec the manifest records, or for a
    folder that records none by kind and size; a tokenizer.json by its text)."""
    same: bool
    if spec == "bytes" or spec.startswith("bpe:"):
        if manifest.tokenizer_spec is not None:
            same = manifest.tokenizer_spec == spec
        elif spec == "bytes":
            same = not isinstance(tokenizer, BpeTokenizer)
        else:
            size = spec[4:]
            same = isinstance(tokenizer, BpeTokenizer) and size.isdigit()
            same = same and tokenizer.vocab_size <= int(size[:12])
    else:
        same = tokenizer_json(read_tokenizer(spec)) == tokenizer_json(tokenizer)
    if not same:
        was = manifest.tokenizer_spec or f"tokenizer {manifest.tokenizer_hash[:12]}"
        raise DataError(
            f"--out {out}: prepared with another tokenizer ({was}), not --tokenizer {spec}; "
            f"choose a new folder"
        )


def _check_same_sources(out: Path, manifest: Manifest, sources: Sequence[Source]) -> None:
    """Refuse to resume over sources that changed since the preparation began: the finished
    shards hold the first documents of the old ones, so a file added, removed or rewritten
    would drop documents or write some twice."""
    if manifest.source_files is None:
        raise DataError(
            f"--out {out}: an unfinished preparation that records no list of its source files, "
            f"so resuming it cannot be checked; choose a new folder"
        )
    now = {str(p): (size, mtime) for p, size, mtime in fingerprint(sources)}
    try:
        then = {str(p): (size, mtime) for p, size, mtime in manifest.source_files}
    except (TypeError, ValueError):
        raise DataError(f"{out / MANIFEST}: damaged manifest (its source files)") from None
    changed = sorted(set(now) ^ set(then)) or sorted(p for p in now if now[p] != then[p])
    if changed:
        what = "added or removed" if set(now) ^ set(then) else "changed"
        raise DataError(
            f"--out {out}: the sources changed since this preparation began ({changed[0]} "
            f"{what}{f' and {len(changed) - 1} more' if len(changed) > 1 else ''}); resuming "
            f"would drop or repeat documents, so prepare into a new folder"
        )


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
