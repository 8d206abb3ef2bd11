"""A tiny byte-level BPE trained on a few KB of text, and untrained tiny checkpoints that carry
it (or the byte tokenizer), for the tests of every reader of a model's tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from smelt_interp.checkpoint import save_checkpoint
from smelt_interp.config import ModelConfig
from smelt_interp.data.bpe import BpeTokenizer, Tokenizer, tokenizer_record, train_bpe
from smelt_interp.model.transformer import SmeltModel

BPE_VOCAB = 320


def sample_texts() -> list[str]:
    """About 6 KB of repetitive English and Python, with multi-byte characters."""
    texts = [
        f"def function_{i}(value):\n    return value * {i} + the_offset  # ünïcödé ✓\n"
        for i in range(40)
    ]
    texts += [f"The quick brown fox {i} jumps over the lazy dog. 日本語 🙂\n" for i in range(40)]
    return texts


def tiny_bpe() -> BpeTokenizer:
    """A BPE of BPE_VOCAB ids learned from sample_texts (milliseconds)."""
    return train_bpe(iter(sample_texts()), BPE_VOCAB)


def tiny_checkpoint(
    path: Path, tokenizer: Tokenizer, *, looped: bool = True, seed: int = 0, **fields: Any
) -> Path:
    """An untrained tiny model whose vocabulary is `tokenizer`'s, saved with it."""
    from conftest import TINY_FIELDS

    merged = {**TINY_FIELDS, "vocab_size": tokenizer.vocab_size, **fields}
    cfg = ModelConfig.smelt(**merged) if looped else ModelConfig.baseline(**merged)
    torch.manual_seed(seed)
    model = SmeltModel(cfg)
    return save_checkpoint(path, model, step=0, tokenizer=tokenizer_record(tokenizer))
