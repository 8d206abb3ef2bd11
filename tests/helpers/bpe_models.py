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


def prepared_bpe_shards(root: Path) -> Path:
    """Two domains of sample_texts (English and Python, several copies so every domain has
    held-out documents) prepared into BPE shards under `root`/shards."""
    import json

    from smelt_interp.data.prepare import prepare

    texts = sample_texts()
    sources = {"code": [t for t in texts if t.startswith("def")], "prose": texts[40:]}
    specs = []
    for domain, docs in sources.items():
        path = root / f"{domain}.jsonl"
        lines = [json.dumps({"text": f"{i}: {t * (1 + i % 3)}"}) for i, t in enumerate(docs * 2)]
        path.write_text("\n".join(lines) + "\n")
        specs.append(f"{domain}={path}")
    out = root / "shards"
    prepare(specs, out, f"bpe:{BPE_VOCAB}", shard_tokens=2000)
    return out


def trained_on_shards(folder: Path, out: Path, arch: str = "baseline", steps: int = 2) -> Path:
    """A tiny run of `arch` for `steps` steps on the prepared `folder`; its checkpoint."""
    from smelt_interp.data.shards import ShardSet
    from smelt_interp.train.config import TrainConfig
    from smelt_interp.train.trainer import Trainer

    tokenizer = ShardSet(folder).tokenizer
    cfg = TrainConfig.from_dict(
        {
            "model": {
                "d_model": 32,
                "n_layers": 2,
                "n_heads": 2,
                "n_kv_heads": 1,
                "d_head": 16,
                "n_experts": 2,
                "top_k": 1,
                "d_expert": 32,
                "vocab_size": tokenizer.vocab_size,
            },
            "arch": arch,
            "shards": str(folder),
            "data": {d: 1.0 for d in ShardSet(folder).domains("train")},
            "seq_len": 32,
            "batch_size": 4,
            "steps": steps,
            "warmup_steps": 1,
            "eval_every": 1000,
            "eval_rows": 2,
            "dyck_eval_n": 0,
        }
    )
    trainer = Trainer(cfg, out, progress=False)
    trainer.run()
    trainer.batches.close()
    return out / "ckpt.pt"
