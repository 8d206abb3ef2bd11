"""Text in and out of a model through its own tokenizer: the tokenizer a checkpoint carries
(BPE, or bytes when it names none; a record that does not match its hash is one TokenizerError
line), per-token labels of a text, and greedy or sampled completion decoded back to text. The
notebooks and any script that reads a model go through here rather than a tokenizer of their
own choosing."""

from __future__ import annotations

import os

import torch

from smelt_interp.checkpoint import read_info
from smelt_interp.data.bpe import Tokenizer, checkpoint_tokenizer
from smelt_interp.errors import ProbeError
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes.inputs import prompt_batch


def tokenizer_of(path: str | os.PathLike[str]) -> Tokenizer:
    """The tokenizer the checkpoint file at `path` carries."""
    return checkpoint_tokenizer(read_info(path).meta)


def text_labels(tokenizer: Tokenizer, text: str) -> tuple[list[int], list[str]]:
    """(ids, labels) of BOS + `text` in `tokenizer`'s ids: what a heatmap's axes show."""
    ids = tokenizer.encode(text)
    return ids, tokenizer.token_labels(ids)


def complete_text(
    model: SmeltModel,
    tokenizer: Tokenizer,
    prompt: str,
    max_new_tokens: int = 32,
    *,
    temperature: float = 0.0,
    seed: int = 0,
) -> str:
    """The text `model` writes after `prompt` (greedy when temperature is 0), encoded and
    decoded with `tokenizer`; generation stops early at EOS."""
    if max_new_tokens < 1:
        raise ProbeError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    room = model.cfg.max_seq_len - max_new_tokens
    tokens, _ = prompt_batch(prompt, tokenizer, room)
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    out = model.generate(tokens, max_new_tokens, temperature=temperature, generator=generator)
    new = out[0, tokens.shape[1] :].tolist()
    if tokenizer.eos_id in new:
        new = new[: new.index(tokenizer.eos_id)]
    return tokenizer.decode(new)
