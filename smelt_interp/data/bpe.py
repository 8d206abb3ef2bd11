"""A byte-level BPE tokenizer beside the byte one, and the one identity both share.

A tokenizer is named by its `tokenizer.json` text: HF `tokenizers`' own file for BPE, and
`{"smelt_tokenizer": "bytes"}` for `ByteTokenizer`. `tokenizer_hash(text)` (SHA-256, 32 hex
digits) names it in shard headers and checkpoints, so tokens are only ever decoded by the
tokenizer that made them; a mismatch is one TokenizerError line.

BPE is byte-level (any text encodes, and decoding gives back the exact text). Its ids are laid
out like the byte tokenizer's: 0..255 are the single bytes, 256, 257 and 258 are `<pad>`,
`<bos>` and `<eos>` (PAD_ID, BOS_ID, EOS_ID, which the losses, packing and probes use), and the
merges follow from 259. A tokenizer.json loaded from elsewhere must hold the three specials at
those ids. `resolve_tokenizer(spec, texts)` turns
the command-line spec into a tokenizer: `bytes`, `bpe:VOCAB_SIZE` (trained on `texts`) or the
path of a `tokenizer.json`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from smelt_interp.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_NAMES,
    VOCAB_SIZE,
    ByteTokenizer,
)
from smelt_interp.errors import TokenizerError
from smelt_interp.files import parse_json, read_input_text

BYTES_JSON = json.dumps({"smelt_tokenizer": "bytes", "vocab_size": VOCAB_SIZE}, sort_keys=True)
SPECIALS = ("<pad>", "<bos>", "<eos>")  # at PAD_ID, BOS_ID, EOS_ID
MIN_BPE_VOCAB = 259  # the 256 byte symbols and the three specials
MAX_BPE_VOCAB = 1 << 20
MAX_TOKENIZER_BYTES = 256 * 2**20


class Tokenizer(Protocol):
    """What every consumer of token ids needs: the specials, encode, decode and labels."""

    pad_id: int
    bos_id: int
    eos_id: int
    vocab_size: int

    def encode(self, text: str, *, bos: bool = True, eos: bool = False) -> list[int]: ...

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str: ...

    def token_labels(self, ids: Sequence[int]) -> list[str]: ...


def check_encodable(text: str) -> None:
    """TokenizerError naming the first character that is not valid Unicode (a lone surrogate),
    which no tokenizer can encode (the `tokenizers` library would raise a bare TypeError)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TokenizerError(
            f"cannot encode character {text[exc.start]!r} at position {exc.start}: "
            f"not valid Unicode"
        ) from None


def tokenizer_hash(text: str) -> str:
    """The identity of a tokenizer: 32 hex digits of the SHA-256 of its tokenizer.json text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded id tensor [batch, max_len] and lengths [batch] of rows of ids."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    out = torch.full((len(rows), max(1, int(lengths.max()))), pad_id, dtype=torch.long)
    for r, row in enumerate(rows):
        out[r, : len(row)] = torch.tensor(list(row), dtype=torch.long)
    return out, lengths


class TokenizersJson:
    """What every tokenizer read from an HF `tokenizers` tokenizer.json shares, this project's
    BPE and a model folder's own (data.folder_tokenizer): loading with a one-line error, the
    identity (`json`, `hash`; equal texts are one tokenizer, a cache key's part), offsets,
    decoding checked against the vocabulary, and padded batches. `where`, when given, names the
    file in errors."""

    bos_id: int | None
    pad_id: int

    def __init__(self, json_text: str, where: str | None = None):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok = HFTokenizer.from_str(json_text)
        except Exception as exc:  # noqa: BLE001 - the library raises plain Exceptions
            line = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "unreadable"
            lead = f"{where}: " if where else ""
            raise TokenizerError(f"{lead}not a tokenizers tokenizer.json ({line})") from None
        self.json = json_text
        self.hash = tokenizer_hash(json_text)
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.hash == self.hash  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self.hash)

    def _text_ids(self, text: str) -> list[int]:
        """`text`'s ids without specials (TokenizerError for text that is not text)."""
        if not isinstance(text, str):
            raise TokenizerError(f"expected text, got {type(text).__name__}")
        check_encodable(text)
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """(ids, offsets) of `text` without specials: each token's [start, end) in characters
        of `text` (what carries character positions, such as a Dyck answer's, to tokens)."""
        check_encodable(text)
        enc = self._tok.encode(text, add_special_tokens=False)
        return list(enc.ids), [(int(s), int(e)) for s, e in enc.offsets]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids without specials, encoded in parallel by the library's threads."""
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def _checked(self, ids: Iterable[int]) -> list[int]:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise TokenizerError(
                f"token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})"
            )
        return ids

    def encode(self, text: str, *, bos: bool = True, eos: bool = False) -> list[int]:
        raise NotImplementedError

    def batch(self, texts: Sequence[str], *, bos: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded id tensor [batch, max_len] and lengths [batch]."""
        return pad_rows([self.encode(t, bos=bos) for t in texts], self.pad_id)


class BpeTokenizer(TokenizersJson):
    """HF `tokenizers` byte-level BPE with PAD, BOS and EOS at this project's ids."""

    def __init__(self, json_text: str):
        super().__init__(json_text)
        ids = [self._tok.token_to_id(name) for name in SPECIALS]
        if any(i is None for i in ids):
            missing = [n for n, i in zip(SPECIALS, ids, strict=True) if i is None]
            raise TokenizerError(
                f"tokenizer.json lacks the special token(s) {', '.join(missing)} "
                f"(a smelt tokenizer has {', '.join(SPECIALS)})"
            )
        self.pad_id, self.bos_id, self.eos_id = (int(i) for i in ids)
        if (self.pad_id, self.bos_id, self.eos_id) != (PAD_ID, BOS_ID, EOS_ID):
            raise TokenizerError(
                f"tokenizer.json holds {', '.join(SPECIALS)} at ids {self.pad_id}, {self.bos_id}, "
                f"{self.eos_id}; smelt needs them at {PAD_ID}, {BOS_ID}, {EOS_ID} "
                f"(train one with --tokenizer bpe:VOCAB_SIZE)"
            )
        self._special = {self.pad_id: "<pad>", self.bos_id: "<bos>", self.eos_id: "<eos>"}
        top = max(self._tok.get_vocab(with_added_tokens=True).values(), default=0)
        if top >= self.vocab_size:  # ids past the count: the shards' dtype and the embedding
            raise TokenizerError(
                f"tokenizer.json holds token id {top}, past its {self.vocab_size} ids "
                f"(0..{self.vocab_size - 1}); its ids must be numbered without gaps"
            )

    def encode(self, text: str, *, bos: bool = True, eos: bool = False) -> list[int]:
        ids = self._text_ids(text)
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        ids = self._checked(ids)
        if skip_special:
            return self._tok.decode([i for i in ids if i not in self._special])
        parts, run = [], []
        for i in ids:
            if i in self._special:
                parts += [self._tok.decode(run), self._special[i]]
                run = []
            else:
                run.append(i)
        return "".join([*parts, self._tok.decode(run)])

    def token_labels(self, ids: Sequence[int]) -> list[str]:
        """One label per token: its decoded text (spaces as ␣), specials by name. A token that
        is part of a multi-byte character shows its bytes as \\xNN."""
        labels = []
        for i in ids:
            i = int(i)
            if i in self._special:
                labels.append(self._special[i])
                continue
            text = self._tok.decode([i])
            if "\ufffd" in text:
                raw = self._token_bytes(i)
                text = raw.decode("utf-8", errors="backslashreplace") if raw is not None else text
            labels.append(text.replace(" ", "␣") or f"<{i}>")
        return labels

    def _token_bytes(self, i: int) -> bytes | None:
        """The bytes of token `i` (byte-level BPE spells them in GPT-2's printable alphabet)."""
        piece = self._tok.id_to_token(i)
        if piece is None:
            return None
        alphabet = _byte_alphabet()
        try:
            return bytes(alphabet[c] for c in piece)
        except KeyError:
            return None


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's map from printable characters back to bytes (what ByteLevel pre-tokenizes to)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def train_bpe(
    texts: Iterable[str], vocab_size: int, pre_tokenizer: Any | None = None
) -> BpeTokenizer:
    """A byte-level BPE tokenizer of `vocab_size` ids (specials included) learned from `texts`,
    which are streamed (any iterable; memory does not grow with their number).

    `pre_tokenizer` (a `tokenizers` pre-tokenizer ending in ByteLevel) replaces the default
    GPT-2 split, for tokenizers that merge across spaces; the specials, the byte alphabet and
    the id layout stay this project's whatever it is."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if not MIN_BPE_VOCAB <= vocab_size <= MAX_BPE_VOCAB:
        raise TokenizerError(
            f"a BPE vocabulary needs {MIN_BPE_VOCAB}..{MAX_BPE_VOCAB} ids, got {vocab_size}"
        )
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(
        add_prefix_space=False, use_regex=True
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return BpeTokenizer(_byte_layout(tok.to_str()))


def _byte_layout(json_text: str) -> str:
    """The trained tokenizer with its ids renumbered: bytes at 0..255, the specials at PAD_ID,
    BOS_ID and EOS_ID, then the merged tokens in their learned order. Merges name tokens by
    their text, so renumbering the vocabulary changes no encoding."""
    data = parse_json(json_text, "the trained tokenizer", TokenizerError)
    vocab: dict[str, int] = data["model"]["vocab"]
    new = {char: byte for char, byte in _byte_alphabet().items()}
    new |= {name: PAD_ID + k for k, name in enumerate(SPECIALS)}
    for piece, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        if piece not in new:
            new[piece] = len(new)
    data["model"]["vocab"] = new
    for added in data.get("added_tokens", []):
        added["id"] = new[added["content"]]
    return json.dumps(data, ensure_ascii=False)


def tokenizer_json(tokenizer: Tokenizer) -> str:
    """The tokenizer.json text that names `tokenizer` (BYTES_JSON for the byte tokenizer; a
    model folder's own, data.folder_tokenizer, carries its text as BPE does)."""
    return getattr(tokenizer, "json", BYTES_JSON)


def tokenizer_from_json(text: str) -> Tokenizer:
    """The tokenizer a tokenizer.json text describes."""
    try:
        data = parse_json(text, "tokenizer.json", TokenizerError)
    except json.JSONDecodeError:
        raise TokenizerError("tokenizer.json is not valid JSON") from None
    if isinstance(data, Mapping) and data.get("smelt_tokenizer") == "bytes":
        return ByteTokenizer()
    return BpeTokenizer(text)


def read_tokenizer_text(path: str | Path) -> str:
    """A tokenizer.json file's text, refused in one line when too large or unreadable."""
    return read_input_text(path, MAX_TOKENIZER_BYTES, TokenizerError, "tokenizer file")


def read_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of a tokenizer.json file."""
    path = Path(path)
    text = read_tokenizer_text(path)
    try:
        return tokenizer_from_json(text)
    except TokenizerError as exc:
        raise TokenizerError(f"{path}: {exc}") from None


def resolve_tokenizer(spec: str, texts: Callable[[], Iterator[str]]) -> Tokenizer:
    """`bytes`, `bpe:VOCAB_SIZE` (trained on the texts `texts()` yields) or a tokenizer.json
    path."""
    if spec == "bytes":
        return ByteTokenizer()
    if spec.startswith("bpe:"):
        size = spec[4:]
        if not size.isascii() or not size.isdigit():
            raise TokenizerError(f"--tokenizer bpe:VOCAB_SIZE needs a whole number, got {spec!r}")
        return train_bpe(texts(), int(size))
    if not Path(spec).is_file():
        raise TokenizerError(
            f"--tokenizer {spec!r}: not 'bytes', 'bpe:VOCAB_SIZE' or a tokenizer.json file"
        )
    return read_tokenizer(spec)


def checkpoint_tokenizer(meta: Mapping[str, Any]) -> Tokenizer:
    """The tokenizer a checkpoint's metadata carries (`tokenizer`: {"json", "hash"}); the byte
    tokenizer when it carries none (every checkpoint before BPE)."""
    record = meta.get("tokenizer")
    if record is None:
        return ByteTokenizer()
    if not isinstance(record, Mapping) or not isinstance(record.get("json"), str):
        raise TokenizerError("checkpoint's tokenizer record is not {json, hash}")
    text = record["json"]
    if record.get("hash") != tokenizer_hash(text):
        raise TokenizerError(
            f"checkpoint's tokenizer does not match its hash {str(record.get('hash'))[:40]!r}"
        )
    return tokenizer_from_json(text)


def tokenizer_record(tokenizer: Tokenizer) -> dict[str, str]:
    """What a checkpoint saves to name its tokenizer: the tokenizer.json text and its hash."""
    text = tokenizer_json(tokenizer)
    return {"json": text, "hash": tokenizer_hash(text)}


__all__ = [
    "BYTES_JSON",
    "SPECIALS",
    "SPECIAL_NAMES",
    "BpeTokenizer",
    "Tokenizer",
    "checkpoint_tokenizer",
    "read_tokenizer",
    "resolve_tokenizer",
    "tokenizer_from_json",
    "tokenizer_hash",
    "tokenizer_json",
    "tokenizer_record",
    "train_bpe",
]
