"""Packing token streams into fixed-length rows that each start with BOS: documents follow one
another separated by EOS and may run over into the next row (`DocumentStream`, `pack_once`),
or short pieces (Dyck examples) fill a row whole and the one that runs over is cut
(`pack_pieces`) or waits for a later row (`pack_whole`). `document_rows` gives every row a
slice of one document (no attention across documents), and `encode_documents` one padded row
per whole document."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from smelt_interp.data.documents import Document
from smelt_interp.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, ByteTokenizer
from smelt_interp.errors import DataError

if TYPE_CHECKING:
    from smelt_interp.data.bpe import Tokenizer


def document_tokens(doc: Document, tokenizer: Tokenizer | None = None) -> np.ndarray:
    """The document's tokens followed by EOS, as int64: its bytes, or with `tokenizer` (a
    model's own, BPE say) its ids under that tokenizer."""
    if tokenizer is not None and not isinstance(tokenizer, ByteTokenizer):
        return np.array(tokenizer.encode(doc.text, bos=False, eos=True), dtype=np.int64)
    body = np.frombuffer(doc.text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    return np.append(body, EOS_ID)


class DocumentStream:
    """Endless tokens from `docs`, in a fresh seeded shuffle every epoch."""

    def __init__(self, docs: Sequence[Document], rng: random.Random):
        if not docs:
            raise ValueError("DocumentStream needs at least one document")
        self._docs = list(docs)
        self._rng = rng
        self._cache: dict[int, np.ndarray] = {}
        self._order: list[int] = []
        self._current = np.zeros(0, dtype=np.int64)
        self._offset = 0

    def _next_doc(self) -> np.ndarray:
        if not self._order:
            self._order = list(range(len(self._docs)))
            self._rng.shuffle(self._order)
            self._order.reverse()
        i = self._order.pop()
        if i not in self._cache:
            self._cache[i] = document_tokens(self._docs[i])
        return self._cache[i]

    def take(self, n: int) -> np.ndarray:
        parts = []
        while n > 0:
            if self._offset >= len(self._current):
                self._current, self._offset = self._next_doc(), 0
            part = self._current[self._offset : self._offset + n]
            self._offset += len(part)
            n -= len(part)
            parts.append(part)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def row(self, seq_len: int) -> np.ndarray:
        return np.concatenate([[BOS_ID], self.take(seq_len - 1)])


def document_rows(
    docs: Sequence[Document], n_rows: int, seq_len: int, rng: random.Random
) -> torch.Tensor:
    """`n_rows` rows [n_rows, seq_len], each BOS then a slice of ONE random document (its
    bytes and EOS) starting at a random line start, right-padded with PAD_ID when the document
    ends first. No row shows two documents, so BOS is every visible document's first token."""
    if not docs:
        raise DataError("document_rows needs at least one document")
    out = torch.full((n_rows, seq_len), PAD_ID, dtype=torch.long)
    out[:, 0] = BOS_ID
    for r in range(n_rows):
        tokens = document_tokens(docs[rng.randrange(len(docs))])
        last = max(0, len(tokens) - (seq_len - 1))
        starts = np.concatenate([[0], np.flatnonzero(tokens[:last] == ord("\n")) + 1])
        start = int(starts[rng.randrange(len(starts))])
        chunk = torch.from_numpy(tokens[start : start + seq_len - 1])
        out[r, 1 : 1 + len(chunk)] = chunk
    return out


def pack_once(
    docs: Sequence[Document], n_rows: int, seq_len: int, tokenizer: Tokenizer | None = None
) -> torch.Tensor:
    """Rows from `docs` in the given order, each token used once: at most `n_rows` rows, the
    last right-padded with PAD_ID (a loss must ignore PAD targets). For evaluation. Documents
    are bytes, or `tokenizer`'s ids (every tokenizer holds PAD and BOS at the byte ids)."""
    stream = (
        np.concatenate([document_tokens(d, tokenizer) for d in docs])
        if docs
        else np.zeros(0, dtype=np.int64)
    )
    width = seq_len - 1
    n = min(n_rows, -(-len(stream) // width))
    out = torch.full((n, seq_len), PAD_ID, dtype=torch.long)
    out[:, 0] = BOS_ID
    for r in range(n):
        chunk = torch.from_numpy(stream[r * width : (r + 1) * width])
        out[r, 1 : 1 + len(chunk)] = chunk
    return out


def pack_pieces(pieces: Iterator[bytes], n_rows: int, seq_len: int) -> torch.Tensor:
    """[n_rows, seq_len]: each row is BOS, then whole pieces from `pieces` until it is full; the
    piece that runs over is cut at the row's end and its rest dropped, so every row starts at a
    piece boundary. No EOS and no padding: meant for a loss on every token."""
    rows = []
    for _ in range(n_rows):
        row = [BOS_ID]
        while len(row) < seq_len:
            row.extend(next(pieces))
        rows.append(row[:seq_len])
    return torch.tensor(rows, dtype=torch.long)


def pack_whole(
    pieces: Iterator[bytes], n_rows: int, seq_len: int, max_waiting: int = 8
) -> torch.Tensor:
    """[n_rows, seq_len]: each row is BOS, then whole pieces only, right-padded with PAD_ID.
    A piece that does not fit in what is left of a row waits for a later row, where waiting
    pieces go first (oldest first); pieces are drawn until one fits, nothing shorter than the
    shortest piece seen is left, or `max_waiting` pieces wait. Unlike `pack_pieces`, no piece
    is cut, so a long Dyck example is trained on whole (cutting drops the end of the answer of
    35-41% of the examples nesting 11+ deep in 320-token rows) at the cost of some padding."""
    width = seq_len - 1
    waiting: list[list[int]] = []
    shortest = width
    rows = torch.full((n_rows, seq_len), PAD_ID, dtype=torch.long)
    rows[:, 0] = BOS_ID
    for r in range(n_rows):
        row: list[int] = []
        for piece in list(waiting):
            if len(row) + len(piece) <= width:
                row.extend(piece)
                waiting.remove(piece)
        while width - len(row) >= shortest and len(waiting) < max_waiting:
            piece = list(next(pieces))
            if not 0 < len(piece) <= width:
                raise DataError(
                    f"a piece of {len(piece)} tokens cannot fill a row of {seq_len} whole"
                )
            shortest = min(shortest, len(piece))
            if len(row) + len(piece) <= width:
                row.extend(piece)
            else:
                waiting.append(piece)
        rows[r, 1 : 1 + len(row)] = torch.tensor(row, dtype=torch.long)
    return rows


def encode_documents(docs: Sequence[Document], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One row per document: BOS + bytes + EOS, cut to `seq_len`, right-padded with PAD_ID.
    Returns (ids [n, seq_len], lengths [n]) for loss-by-sample-length analysis."""
    out = torch.full((len(docs), seq_len), PAD_ID, dtype=torch.long)
    lengths = torch.zeros(len(docs), dtype=torch.long)
    for r, doc in enumerate(docs):
        row = np.concatenate([[BOS_ID], document_tokens(doc)])[:seq_len]
        out[r, : len(row)] = torch.from_numpy(row)
        lengths[r] = len(row)
    return out, lengths
