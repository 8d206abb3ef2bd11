"""Token shards: flat token-id files with a header and a document index, read memory-mapped.

A prepared folder holds

    tokenizer.json                    the tokenizer every shard was made with
    manifest.json                     sources, tokenizer hash, the finished shards (name,
                                      domain, split, tokens, documents); `complete` at the end
    DOMAIN-SPLIT-NNNNN.tok            the shards

One shard file is, in order (all integers little-endian):

    header, HEADER_BYTES = 1024 bytes:
        magic           8 bytes   b"SMELTTOK"
        version         uint32    FORMAT_VERSION
        itemsize        uint32    2 (uint16 ids: the vocabulary fits) or 4 (uint32)
        n_tokens        uint64
        n_docs          uint64
        vocab_size      uint32
        bos_id          uint32
        tokenizer hash  32 ASCII hex digits (bpe.tokenizer_hash of tokenizer.json)
        split           16 bytes, UTF-8, NUL-padded ("train" or "heldout")
        domain          64 bytes, UTF-8, NUL-padded
        zeros to 1024
    tokens      n_tokens x itemsize: every document is BOS followed by its ids (no EOS; the
                next BOS ends it), so an empty document is one BOS
    doc index   (n_docs + 1) x int64: each document's offset in `tokens`, then n_tokens

A shard is written to a temporary name and renamed when whole, so a shard on disk is complete or
absent; its size must equal what the header says, else it is refused as truncated. A reader
checks the magic, the version and (when asked) the tokenizer hash before it reads a token.

Rows: `row_plan` cuts a shard into BOS-led rows, `DomainRows` reads a (domain, split)'s rows
over its shards (the trainer's loader and the probes both read them), `heldout_rows` a domain's
first held-out rows, the fixed rows every evaluation of a folder reads."""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from smelt_interp.errors import DataError
from smelt_interp.files import open_input, parse_json, read_input_text

MAGIC = b"SMELTTOK"
FORMAT_VERSION = 1
HEADER_BYTES = 1024
_HEADER = struct.Struct("<8sIIQQII32s16s64s")
SUFFIX = ".tok"
MANIFEST = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
MAX_MANIFEST_BYTES = 64 * 2**20  # a manifest lists shards: a few KiB for a large corpus
MAX_SHARD_BYTES = 1 << 40


class ShardError(DataError):
    """A shard that cannot be read: truncated, foreign, of another version or tokenizer."""


@dataclass(frozen=True)
class ShardHeader:
    """The fixed-size head of a shard file."""

    itemsize: int
    n_tokens: int
    n_docs: int
    vocab_size: int
    bos_id: int
    tokenizer_hash: str
    split: str
    domain: str
    version: int = FORMAT_VERSION

    @property
    def dtype(self) -> np.dtype:
        return np.dtype("<u2" if self.itemsize == 2 else "<u4")

    @property
    def file_bytes(self) -> int:
        return HEADER_BYTES + self.n_tokens * self.itemsize + (self.n_docs + 1) * 8

    def pack(self) -> bytes:
        head = _HEADER.pack(
            MAGIC,
            self.version,
            self.itemsize,
            self.n_tokens,
            self.n_docs,
            self.vocab_size,
            self.bos_id,
            self.tokenizer_hash.encode("ascii"),
            self.split.encode("utf-8"),
            self.domain.encode("utf-8"),
        )
        return head + bytes(HEADER_BYTES - len(head))

    @classmethod
    def unpack(cls, path: Path, raw: bytes) -> ShardHeader:
        if len(raw) < _HEADER.size or raw[:8] != MAGIC:
            raise ShardError(f"{path}: not a token shard (no {MAGIC.decode()} header)")
        magic, version, itemsize, n_tokens, n_docs, vocab, bos, thash, split, domain = (
            _HEADER.unpack_from(raw)
        )
        if version != FORMAT_VERSION:
            raise ShardError(
                f"{path}: shard format version {version}, this program reads {FORMAT_VERSION}; "
                f"prepare the data again"
            )
        if itemsize not in (2, 4):
            raise ShardError(f"{path}: damaged header (token size {itemsize} bytes)")
        try:
            return cls(
                itemsize,
                n_tokens,
                n_docs,
                vocab,
                bos,
                thash.decode("ascii"),
                split.rstrip(b"\0").decode("utf-8"),
                domain.rstrip(b"\0").decode("utf-8"),
                version,
            )
        except UnicodeDecodeError:
            raise ShardError(f"{path}: damaged header (names are not text)") from None


def itemsize_for(vocab_size: int) -> int:
    """2 bytes a token where the vocabulary fits in uint16, else 4."""
    return 2 if vocab_size <= 1 << 16 else 4


def shard_name(domain: str, split: str, index: int) -> str:
    return f"{domain}-{split}-{index:05d}{SUFFIX}"


class ShardWriter:
    """Appends documents (BOS-led id arrays) to one shard under a temporary name; `close`
    writes the index and header, fsyncs and renames. Memory holds only the document index."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        vocab_size: int,
        bos_id: int,
        tokenizer_hash: str,
        domain: str,
        split: str,
    ):
        self.path = Path(path)
        self._tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.part")
        self._fh = open(self._tmp, "wb")  # noqa: SIM115 - closed in close() / abort()
        self._fh.write(bytes(HEADER_BYTES))
        self.dtype = np.dtype("<u2" if itemsize_for(vocab_size) == 2 else "<u4")
        self._offsets = array("q", [0])
        self.n_tokens = 0
        self._meta = dict(
            vocab_size=vocab_size,
            bos_id=bos_id,
            tokenizer_hash=tokenizer_hash,
            domain=domain,
            split=split,
        )
        if len(domain.encode("utf-8")) > 64 or len(split.encode("utf-8")) > 16:
            raise DataError(f"domain name {domain!r} is longer than 64 bytes")

    @property
    def n_docs(self) -> int:
        return len(self._offsets) - 1

    def add(self, ids: np.ndarray) -> None:
        """One document: its ids, BOS first; an id the shard's dtype or vocabulary cannot hold
        is refused (a cast would store another token)."""
        ids = np.asarray(ids)
        if len(ids) and (int(ids.max()) >= self._meta["vocab_size"] or int(ids.min()) < 0):
            bad = int(ids.max()) if int(ids.max()) >= self._meta["vocab_size"] else int(ids.min())
            raise DataError(
                f"token id {bad} is outside the tokenizer's {self._meta['vocab_size']} ids, "
                f"which {self.path.name} stores as {self.dtype.name}; nothing of it is written"
            )
        self._fh.write(ids.astype(self.dtype).tobytes())
        self.n_tokens += len(ids)
        self._offsets.append(self.n_tokens)

    def close(self) -> ShardHeader:
        header = ShardHeader(
            itemsize=self.dtype.itemsize, n_tokens=self.n_tokens, n_docs=self.n_docs, **self._meta
        )
        self._fh.write(np.frombuffer(self._offsets, dtype=np.int64).astype("<i8").tobytes())
        self._fh.seek(0)
        self._fh.write(header.pack())
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        os.replace(self._tmp, self.path)
        return header

    def abort(self) -> None:
        """Drop the partial shard (nothing already renamed is touched)."""
        self._fh.close()
        self._tmp.unlink(missing_ok=True)


class Shard:
    """One shard, memory-mapped: `tokens` (uint16/uint32) and `offsets` (int64, n_docs + 1)."""

    def __init__(self, path: str | os.PathLike[str], tokenizer_hash: str | None = None):
        self.path = Path(path)
        with open_input(self.path, MAX_SHARD_BYTES, ShardError, "shard") as fh:
            try:
                size = os.fstat(fh.fileno()).st_size
                raw = fh.read(HEADER_BYTES)
            except OSError as exc:
                raise ShardError(f"{self.path}: cannot read shard ({exc.strerror})") from None
        self.header = ShardHeader.unpack(self.path, raw)
        h = self.header
        if tokenizer_hash is not None and h.tokenizer_hash != tokenizer_hash:
            raise ShardError(
                f"{self.path}: made with tokenizer {h.tokenizer_hash[:12]}, not this one "
                f"({tokenizer_hash[:12]}); prepare it again with the same tokenizer"
            )
        if size != h.file_bytes:
            raise ShardError(
                f"{self.path}: truncated or damaged ({size} bytes, its header says {h.file_bytes})"
            )
        self.tokens = np.memmap(self.path, h.dtype, "r", HEADER_BYTES, (h.n_tokens,))
        self.offsets = np.memmap(
            self.path, "<i8", "r", HEADER_BYTES + h.n_tokens * h.itemsize, (h.n_docs + 1,)
        )
        if (
            self.offsets[0] != 0
            or self.offsets[-1] != h.n_tokens
            or bool((np.diff(self.offsets) < 1).any())
            or not self._documents_start_with_bos()
        ):
            raise ShardError(f"{self.path}: damaged document index")

    def _documents_start_with_bos(self) -> bool:
        """Whether every document's first token is BOS, read with pread rather than through
        the memory map: a mapped read faults in the pages around each document's start, which
        over a shard of short documents is most of the file, and they would count in this
        process's RSS for as long as the shard is open (the loader's, for a whole run)."""
        h = self.header
        bos = np.array(h.bos_id, dtype=h.dtype).tobytes()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return all(
                os.pread(fd, h.itemsize, HEADER_BYTES + start * h.itemsize) == bos
                for start in self.offsets[:-1].tolist()
            )
        finally:
            os.close(fd)

    def __len__(self) -> int:
        return self.header.n_docs

    def document(self, i: int) -> np.ndarray:
        """Document `i`'s ids, BOS first."""
        return np.asarray(self.tokens[self.offsets[i] : self.offsets[i + 1]])

    def documents(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self.document(i)


def row_plan(shard: Shard, row_len: int) -> np.ndarray:
    """The rows of one shard as an int64 array [n_rows, 2] of (start, continued): a row is
    `row_len` tokens from `start`, which is a document's BOS (continued = 0), or, where a row
    ran out inside a document, BOS followed by `row_len - 1` tokens of its rest (continued = 1).
    Rows follow one another over the whole shard, so every token is in exactly one row, every
    row starts with BOS, and the last row may end early (padded by the reader).

    One pass over the documents, not the rows, and the rows built as arrays: memory is 16 bytes
    a row and a few a document (a list of rows would hold ~100 bytes a row: 400 MB for 1 GB of
    bytes in 256-token rows)."""
    if row_len < 2:
        raise DataError(f"rows need at least 2 tokens, got {row_len}")
    step = row_len - 1
    bounds = np.asarray(shard.offsets, dtype=np.int64)
    n_docs = len(bounds) - 1
    first = np.zeros(n_docs, dtype=np.int64)  # where the document's first row starts
    count = np.zeros(n_docs, dtype=np.int64)  # rows that start inside the document
    fresh = np.zeros(n_docs, dtype=bool)  # its first row starts at its BOS
    p = 0  # the next row's start
    for d, (start, end) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist())):
        if p >= end:  # a row started before it runs past its end
            continue
        first[d] = p
        if p == start:
            fresh[d] = True
            p += row_len
            extra = -(-(end - p) // step) if p < end else 0
            count[d] = 1 + extra
        else:
            extra = -(-(end - p) // step)
            count[d] = extra
        p += extra * step
    doc = np.repeat(np.arange(n_docs), count)
    j = np.arange(len(doc)) - np.repeat(np.cumsum(count) - count, count)  # row within its doc
    starts = first[doc] + j * step + (fresh[doc] & (j >= 1))  # a fresh row is 1 token longer
    continued = ~(fresh[doc] & (j == 0))
    return np.stack([starts, continued.astype(np.int64)], axis=1)


def read_row(shard: Shard, start: int, continued: int, row_len: int, pad_id: int) -> np.ndarray:
    """One row of `row_plan` as int64 ids, right-padded with `pad_id` at the shard's end."""
    out = np.full(row_len, pad_id, dtype=np.int64)
    if continued:
        out[0] = shard.header.bos_id
        body = shard.tokens[start : start + row_len - 1]
        out[1 : 1 + len(body)] = body
    else:
        body = shard.tokens[start : start + row_len]
        out[: len(body)] = body
    return out


class ShardSet:
    """A prepared folder: its tokenizer and its shards by (domain, split), all checked (header,
    version, tokenizer hash, size) when opened. `expect_hash`: refuse a folder whose tokenizer
    is not this one (a model's)."""

    def __init__(self, folder: str | os.PathLike[str], expect_hash: str | None = None):
        from smelt_interp.data.bpe import read_tokenizer, tokenizer_hash, tokenizer_json

        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise DataError(f"{self.folder}: no such folder of prepared shards")
        manifest_path = self.folder / MANIFEST
        if not manifest_path.exists() and not manifest_path.is_symlink():
            raise DataError(
                f"{self.folder}: no {MANIFEST}; prepare it with python -m smelt_interp.data prepare"
            )
        manifest = read_manifest(manifest_path)
        if not isinstance(manifest.get("shards"), list):
            raise DataError(f"{manifest_path}: damaged manifest (no shard list)")
        version = str(manifest.get("version"))[:20]
        if version != str(FORMAT_VERSION):
            raise ShardError(f"{manifest_path}: format version {version}, not {FORMAT_VERSION}")
        if not manifest.get("complete"):
            raise DataError(
                f"{self.folder}: preparation unfinished; run the same prepare command again"
            )
        self.tokenizer = read_tokenizer(self.folder / TOKENIZER_FILE)
        self.tokenizer_hash = tokenizer_hash(tokenizer_json(self.tokenizer))
        if manifest.get("tokenizer_hash") != self.tokenizer_hash:
            raise ShardError(f"{self.folder / TOKENIZER_FILE}: not the tokenizer of its manifest")
        if expect_hash is not None and expect_hash != self.tokenizer_hash:
            raise ShardError(
                f"{self.folder}: shards of tokenizer {self.tokenizer_hash[:12]}, but the model's "
                f"tokenizer is {expect_hash[:12]}"
            )
        self.shards: dict[tuple[str, str], list[Shard]] = {}
        for entry in manifest["shards"]:
            try:
                name, key = entry["file"], (entry["domain"], entry["split"])
            except (KeyError, TypeError):
                raise DataError(f"{manifest_path}: damaged manifest (a shard entry)") from None
            if not isinstance(name, str) or Path(name).name != name:
                raise DataError(
                    f"{manifest_path}: shard name {str(name)[:60]!r} is not a file name"
                )
            shard = Shard(self.folder / name, self.tokenizer_hash)
            if (shard.header.domain, shard.header.split) != key:
                raise ShardError(f"{shard.path}: header names another domain or split")
            self.shards.setdefault(key, []).append(shard)

    def domains(self, split: str = "train") -> list[str]:
        return sorted(d for d, s in self.shards if s == split)

    def select(self, domain: str, split: str) -> list[Shard]:
        return self.shards.get((domain, split), [])


class DomainRows:
    """All rows of one (domain, split) over its shards, in shard order."""

    def __init__(self, shards: list[Shard], row_len: int, pad_id: int):
        self.shards = shards
        self.row_len = row_len
        self.pad_id = pad_id
        plans = [row_plan(s, row_len) for s in shards]
        which = [np.full((len(p), 1), i, dtype=np.int64) for i, p in enumerate(plans)]
        self.plan = np.concatenate([np.concatenate(which), np.concatenate(plans)], axis=1)

    def __len__(self) -> int:
        return len(self.plan)

    def rows(self, indices: np.ndarray) -> np.ndarray:
        """Rows [len(indices), row_len] as int64."""
        out = np.empty((len(indices), self.row_len), dtype=np.int64)
        for k, i in enumerate(indices):
            shard, start, continued = self.plan[i]
            out[k] = read_row(self.shards[shard], start, continued, self.row_len, self.pad_id)
        return out


def heldout_rows(shards: ShardSet, domain: str, row_len: int, n_rows: int) -> torch.Tensor:
    """The first `n_rows` rows [m, row_len] of a domain's held-out shards, in shard order
    (deterministic, so every evaluation of a folder reads the same rows)."""
    selected = shards.select(domain, "heldout")
    if not selected:
        raise DataError(f"domain {domain!r} has no held-out shards in {shards.folder}")
    rows = DomainRows(selected, row_len, shards.tokenizer.pad_id)
    return torch.from_numpy(rows.rows(np.arange(min(n_rows, len(rows)))))


def read_manifest(path: Path) -> dict:
    """A prepared folder's manifest.json as a dict, read as an input (a regular file within
    MAX_MANIFEST_BYTES, parsed within bounds); anything else is one DataError line."""
    import json

    text = read_input_text(path, MAX_MANIFEST_BYTES, DataError, "manifest")
    try:
        manifest = parse_json(text, f"{path}", DataError)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: damaged manifest ({' '.join(str(exc).split())[:120]})") from None
    if not isinstance(manifest, dict):
        raise DataError(f"{path}: damaged manifest (not a JSON object)")
    return manifest


def is_prepared_folder(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a folder `prepare` wrote (it holds a manifest)."""
    return (Path(path) / MANIFEST).is_file()


def heldout_mix(shards: ShardSet, row_len: int, n_rows: int) -> torch.Tensor:
    """Up to `n_rows` held-out rows [m, row_len] over every held-out domain in sorted order,
    an even share each (the first domains take the remainder; what a short domain cannot give
    goes to the others), each domain's rows in heldout_rows' order. What a probe reads from a
    prepared folder: text none of the folder's models trained on."""
    domains = shards.domains("heldout")
    if not domains:
        raise DataError(f"{shards.folder}: no held-out shards")
    pad = shards.tokenizer.pad_id
    rows = {d: DomainRows(shards.select(d, "heldout"), row_len, pad) for d in domains}
    share = dict.fromkeys(domains, 0)
    left = n_rows
    while left > 0 and (open_domains := [d for d in domains if share[d] < len(rows[d])]):
        each, extra = divmod(left, len(open_domains))
        for i, d in enumerate(open_domains):
            take = min(len(rows[d]) - share[d], each + (i < extra))
            share[d] += take
            left -= take
    parts = [torch.from_numpy(rows[d].rows(np.arange(share[d]))) for d in domains if share[d]]
    return torch.cat(parts)
