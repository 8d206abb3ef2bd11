"""The tokenizer of a transformers model folder, in the workbench's Tokenizer protocol, so probes,
pages and notebooks encode text and label tokens of an adapted looped model as they do for a
checkpoint's own: the folder's `tokenizer.json` through HF `tokenizers` (FolderTokenizer), or,
for a folder that holds none (a tiny random-initialised model), ids only (IdsTokenizer): rows
then come as token ids (`--prompt-ids`), and text is refused in one line.

`bos_id` is the folder's BOS only where its tokenizer adds one to a row; otherwise it is None
and the first position of a row stands in for BOS in every sink measure."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from smelt_interp.data.bpe import MAX_TOKENIZER_BYTES, check_encodable, tokenizer_hash
from smelt_interp.errors import TokenizerError

TOKENIZER_FILE = "tokenizer.json"


def _padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded id tensor [batch, max_len] and lengths [batch]."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    out = torch.full((len(rows), max(1, int(lengths.max()))), pad, dtype=torch.long)
    for r, row in enumerate(rows):
        out[r, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out, lengths


class IdsTokenizer:
    """No tokenizer: ids are their own labels, and text cannot be encoded."""

    def __init__(self, vocab_size: int, pad_id: int = 0, where: str = "this model's folder"):
        self.vocab_size = vocab_size
        self.pad_id = pad_id
        self.bos_id: int | None = None
        self.eos_id: int | None = None
        self.where = where
        self.json = json.dumps({"smelt_tokenizer": "ids", "vocab_size": vocab_size})
        self.hash = tokenizer_hash(self.json)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdsTokenizer) and other.hash == self.hash

    def __hash__(self) -> int:
        return hash(self.hash)

    def encode(self, text: str, *, bos: bool = True, eos: bool = False) -> list[int]:
        raise TokenizerError(
            f"{self.where} has no {TOKENIZER_FILE}, so text cannot be encoded; "
            f"give the row as token ids (--prompt-ids 1,17,42)"
        )

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        return " ".join(str(int(i)) for i in ids)

    def token_labels(self, ids: Sequence[int]) -> list[str]:
        return [str(int(i)) for i in ids]

    def batch(self, texts: Sequence[str], *, bos: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        return _padded([self.encode(t, bos=bos) for t in texts], self.pad_id)


class FolderTokenizer:
    """A transformers folder's tokenizer.json through HF `tokenizers`. `bos_id` is the id its
    post-processor puts first in a row, or None where it adds none."""

    def __init__(self, json_text: str, where: str):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok = HFTokenizer.from_str(json_text)
        except Exception as exc:  # noqa: BLE001 - the library raises plain Exceptions
            line = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "unreadable"
            raise TokenizerError(f"{where}: not a tokenizers tokenizer.json ({line})") from None
        self.json = json_text
        self.hash = tokenizer_hash(json_text)
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        plain = self._tok.encode("a", add_special_tokens=False).ids
        marked = self._tok.encode("a", add_special_tokens=True).ids
        added = marked[: len(marked) - len(plain)] if marked[-len(plain) :] == plain else []
        self.bos_id: int | None = int(added[0]) if len(added) == 1 else None
        pad = self._tok.padding
        self.pad_id = int(pad["pad_id"]) if pad else 0
        self.eos_id: int | None = None
        self._special = {
            int(i): t.content for i, t in self._tok.get_added_tokens_decoder().items() if t.special
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FolderTokenizer) and other.hash == self.hash

    def __hash__(self) -> int:
        return hash(self.hash)

    def encode(self, text: str, *, bos: bool = True, eos: bool = False) -> list[int]:
        """The text's ids, led by BOS where the tokenizer adds one and `bos` asks for it."""
        if not isinstance(text, str):
            raise TokenizerError(f"expected text, got {type(text).__name__}")
        check_encodable(text)
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if bos and self.bos_id is not None else []) + list(ids)

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """(ids, offsets) of `text` without specials: each token's [start, end) in characters
        (what carries a Dyck answer's character positions to tokens)."""
        check_encodable(text)
        enc = self._tok.encode(text, add_special_tokens=False)
        return list(enc.ids), [(int(s), int(e)) for s, e in enc.offsets]

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise TokenizerError(
                f"token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})"
            )
        return self._tok.decode(ids, skip_special_tokens=skip_special)

    def token_labels(self, ids: Sequence[int]) -> list[str]:
        """One label per token: a special by its name, else its text (spaces as ␣)."""
        labels = []
        for i in ids:
            i = int(i)
            text = self._special.get(i) or self._tok.decode([i], skip_special_tokens=False)
            labels.append(text.replace(" ", "␣") or f"<{i}>")
        return labels

    def batch(self, texts: Sequence[str], *, bos: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        return _padded([self.encode(t, bos=bos) for t in texts], self.pad_id)


def folder_tokenizer(folder: str | Path, vocab_size: int) -> FolderTokenizer | IdsTokenizer:
    """The tokenizer a transformers folder holds, or ids only where it holds none."""
    path = Path(folder) / TOKENIZER_FILE
    if not path.is_file():
        return IdsTokenizer(vocab_size, where=str(folder))
    try:
        if path.stat().st_size > MAX_TOKENIZER_BYTES:
            raise TokenizerError(f"{path}: larger than {MAX_TOKENIZER_BYTES >> 20} MiB")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path}: cannot read tokenizer ({exc})") from None
    return FolderTokenizer(text, str(path))
