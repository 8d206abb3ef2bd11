"""The prompt a page opens on for a model: a held-out example of the model's own task, sized to
its context, so the first view of any served model draws (a Dyck model's default never asks a
64-token recall model to read 81 tokens). A Dyck model gets an in-context example, its
demonstrations answered, with as many of DEMOS demonstrations as fit; a recall model its
held-out row 0, as long as the rows it trained on or its context allows. A model folder without
a tokenizer reads no text: it gets a fixed row of token ids (`ids: ...`, default_ids); a
pretrained dense language model (SmolLM2) ordinary text, TEXT_PROMPT."""

from __future__ import annotations

import numpy as np

from smelt_interp.adapters.inference_loop import DENSE_TYPES
from smelt_interp.app.served import Served, provenance_of
from smelt_interp.data.assoc_recall import recall_rows
from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.dyck import DyckSpec, dyck_max_len, make_dataset
from smelt_interp.data.prompt_text import ids_only, ids_prompt
from smelt_interp.errors import CheckpointError, DataError, TokenizerError
from smelt_interp.provenance import TASK_RECALL, Provenance

DEMOS = 2  # demonstrations in a default Dyck prompt, fewer where the context cannot hold them
WORD_LEN = 10  # brackets per default Dyck word (prefix + answer)
WORD_DEPTH = 4
SEED = 3  # which held-out example
FALLBACK = "( [ {"  # a context too short for any example still gets a prompt that runs
IDS_LEN = 32  # tokens in the default row of a model without a tokenizer
# A pretrained language model (a dense transformers folder: adapters.dense) reads ordinary text:
# a fact it can complete, then a plain sentence, so its first view shows its own sink.
TEXT_PROMPT = (
    "The capital of France is Paris. The capital of Italy is Rome. The river rose slowly "
    "through the night, and by morning the fields beside the mill were under water."
)


def fits(text: str, max_seq_len: int, tokenizer: Tokenizer) -> bool:
    """Whether `text` encodes (BOS included) within `max_seq_len` tokens."""
    try:
        return len(tokenizer.encode(text)) <= max_seq_len
    except TokenizerError:
        return False


def dyck_prompt(spec: DyckSpec, max_seq_len: int, tokenizer: Tokenizer) -> str | None:
    """An in-context example of `spec`'s brackets (short words, DEMOS demonstrations or as
    many as fit), None when not even a bare query fits."""
    for n_demos in range(DEMOS, -1, -1):
        longest = min(WORD_LEN, spec.max_len, dyck_max_len(max_seq_len, n_demos))
        if longest < 2:
            continue
        try:
            words = DyckSpec(
                n_pairs=spec.n_pairs, max_depth=min(WORD_DEPTH, longest // 2), max_len=longest
            )
            text = make_dataset(1, spec=words, n_demos=n_demos, seed=SEED, split="heldout")[0].text
        except DataError:
            continue
        if fits(text, max_seq_len, tokenizer):
            return text
    return None


def recall_prompt(provenance: Provenance, max_seq_len: int, tokenizer: Tokenizer) -> str | None:
    """Held-out recall row 0 of the model's spec (the bytes after BOS as text), as long as its
    training rows and no longer than its context; None when the checkpoint records no spec."""
    try:
        spec = provenance.recall_spec
    except CheckpointError:
        return None
    length = min(provenance.row_len(TASK_RECALL) or max_seq_len, max_seq_len)
    ids = recall_rows(1, max(2, length), seed=0, split="heldout", spec=spec)[0].tolist()
    text = bytes(ids[1:]).decode("latin-1")
    while text and not fits(text, max_seq_len, tokenizer):  # a byte past 0x7f takes two tokens
        text = text[:-1]
    return text or None


def default_ids(vocab_size: int, max_seq_len: int) -> list[int]:
    """The row of ids a model without a tokenizer opens on (and is probed on): IDS_LEN ids
    (fewer where its context is shorter) drawn once from 1..vocab_size-1 with a fixed seed,
    so every page and probe reads the same row."""
    rng = np.random.default_rng(SEED)
    return rng.integers(1, max(2, vocab_size), size=max(1, min(IDS_LEN, max_seq_len))).tolist()


def default_prompt(
    provenance: Provenance,
    max_seq_len: int,
    tokenizer: Tokenizer,
    vocab_size: int | None = None,
    arch: str | None = None,
) -> str:
    """The prompt a page opens on for the model that `provenance` describes (`vocab_size`, the
    model's, for the row of ids of a model without a tokenizer; `arch`, its architecture: a
    pretrained dense LM's gets ordinary text, TEXT_PROMPT)."""
    if ids_only(tokenizer):
        return ids_prompt(default_ids(vocab_size or tokenizer.vocab_size, max_seq_len))
    if arch in DENSE_TYPES and fits(TEXT_PROMPT, max_seq_len, tokenizer):
        return TEXT_PROMPT
    found = None
    if provenance.task == TASK_RECALL:
        found = recall_prompt(provenance, max_seq_len, tokenizer)
    found = found or dyck_prompt(provenance.dyck_spec, max_seq_len, tokenizer)
    return found or FALLBACK


def default_prompt_for(served: Served, model: str | None) -> str:
    """The prompt a page opens on for `model` (the default model when None or not served),
    kept per model version."""
    registry = served.registry
    name = registry.valid(model)
    return served.default_prompts.get_or_compute(
        (name, registry.version(name)),
        lambda: default_prompt(
            provenance_of(served, name),
            registry.cfg(name).max_seq_len,
            registry.tokenizer(name),
            registry.cfg(name).vocab_size,
            getattr(registry.cfg(name), "arch", None),
        ),
    )
