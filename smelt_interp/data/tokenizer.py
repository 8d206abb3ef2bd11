"""A byte-level tokenizer: ids 0..255 are the UTF-8 bytes, then PAD, BOS and EOS.

Every training and probing sequence starts with BOS, so position 0 is always the attention
"sink" candidate the probes measure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from smelt_interp.errors import TokenizerError

PAD_ID = 256
BOS_ID = 257
EOS_ID = 258
VOCAB_SIZE = 259
SPECIAL_NAMES = {PAD_ID: "<pad>", BOS_ID: "<bos>", EOS_ID: "<eos>"}


class ByteTokenizer:
    """UTF-8 bytes plus three specials. Text that is not valid Unicode (lone surrogates)
    cannot be encoded and raises TokenizerError."""

    pad_id = PAD_ID
    bos_id = BOS_ID
    eos_id = EOS_ID
    vocab_size = VOCAB_SIZE

    # Every byte tokenizer is the same tokenizer: equal, with one hash (a cache key's part).
    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer)

    def __hash__(self) -> int:
        return hash(ByteTokenizer)

    def encode(self, text: str, *, bos: bool = True, eos: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TokenizerError(f"expected text, got {type(text).__name__}")
        try:
            ids = list(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise TokenizerError(
                f"cannot encode character {text[exc.start]!r} at position {exc.start}: "
                f"not valid Unicode"
            ) from None
        return ([BOS_ID] if bos else []) + ids + ([EOS_ID] if eos else [])

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        out = bytearray()
        parts: list[str] = []
        for i in ids:
            i = int(i)
            if i < 256:
                out.append(i)
            elif not skip_special:
                parts.append(out.decode("utf-8", errors="replace"))
                out = bytearray()
                parts.append(SPECIAL_NAMES.get(i, f"<{i}>"))
            elif i not in SPECIAL_NAMES:
                raise TokenizerError(
                    f"token id {i} is outside the vocabulary (0..{VOCAB_SIZE - 1})"
                )
        parts.append(out.decode("utf-8", errors="replace"))
        return "".join(parts)

    def token_labels(self, ids: Sequence[int]) -> list[str]:
        """One printable label per token, for heatmap axes."""
        labels = []
        for i in ids:
            i = int(i)
            if i in SPECIAL_NAMES:
                labels.append(SPECIAL_NAMES[i])
            elif 32 <= i < 127:
                labels.append(chr(i) if i != 32 else "␣")
            else:
                labels.append(f"\\x{i:02x}")
        return labels

    def batch(self, texts: Sequence[str], *, bos: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded id tensor [batch, max_len] and lengths [batch]."""
        rows = [self.encode(t, bos=bos) for t in texts]
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        out = torch.full((len(rows), int(lengths.max())), PAD_ID, dtype=torch.long)
        for r, row in enumerate(rows):
            out[r, : len(row)] = torch.tensor(row, dtype=torch.long)
        return out, lengths
