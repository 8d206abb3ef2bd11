"""The tokenizer of a transformers model folder, in the workbench's Tokenizer protocol, so probes,
pages and notebooks encode text and label tokens of an adapted looped model as they do for a
checkpoint's own: the folder's `tokenizer.json` through HF `tokenizers` (FolderTokenizer), or,
for a folder that holds none (a tiny random-initialised model), ids only (IdsTokenizer): rows
then come as token ids (`--prompt-ids`), and text is refused in one line.

`bos_id` is the model's first token (the adapter's `first_token_id`: the one token the folder's
tokenizer adds before a row's text), or None where it adds none: the first position of a row
then stands in for BOS in every sink measure."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from smelt_interp.data.bpe import TokenizersJson, pad_rows, read_tokenizer_text, tokenizer_hash
from smelt_interp.errors import TokenizerError

TOKENIZER_FILE = "tokenizer.json"


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
        return pad_rows([self.encode(t, bos=bos) for t in texts], self.pad_id)


class FolderTokenizer(TokenizersJson):
    """A transformers folder's tokenizer.json, leading each row with `bos_id` (None: nothing)."""

    def __init__(self, json_text: str, where: str, bos_id: int | None):
        super().__init__(json_text, where)
        self.bos_id = bos_id
        padding = self._tok.padding
        self.pad_id = int(padding["pad_id"]) if padding else 0
        self.eos_id: int | None = None
        decoder = self._tok.get_added_tokens_decoder()
        self._special = {int(i): t.content for i, t in decoder.items() if t.special}

    def encode(self, text: str, *, bos: bool = True, eos: bool = False) -> list[int]:
        """The text's ids, led by BOS where the tokenizer adds one and `bos` asks for it."""
        lead = [self.bos_id] if bos and self.bos_id is not None else []
        return lead + self._text_ids(text)

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        return self._tok.decode(self._checked(ids), skip_special_tokens=skip_special)

    def token_labels(self, ids: Sequence[int]) -> list[str]:
        """One label per token: a special by its name, else its text (spaces as ␣)."""
        labels = []
        for i in ids:
            i = int(i)
            text = self._special.get(i) or self._tok.decode([i], skip_special_tokens=False)
            labels.append(text.replace(" ", "␣") or f"<{i}>")
        return labels


def folder_tokenizer(
    folder: str | Path, vocab_size: int, bos_id: int | None
) -> FolderTokenizer | IdsTokenizer:
    """The tokenizer a transformers folder holds, or ids only where it holds none; `bos_id`:
    the model's first token (LoopedShape.first_token_id)."""
    path = Path(folder) / TOKENIZER_FILE
    if not path.is_file():
        return IdsTokenizer(vocab_size, where=str(folder))
    return FolderTokenizer(read_tokenizer_text(path), str(path), bos_id)
