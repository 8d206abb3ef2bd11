"""Tiny random-initialised transformers looped models (hrm_text, dory, inkling2_loop) saved as
local model folders (config.json and weights, no tokenizer: ids only), built offline in seconds,
for the tests that serve or probe a folder as a user would (smelt_interp.adapters).

The configs are tests/adapters/test_looped_adapters.py's: 2-4 looped visits, a window shorter
than a default row, 8 experts top-2 for Inkling, whose sink logits are spread so that its
learned sink takes a visible share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 64
ARCHS = ("hrm_text", "dory", "inkling2_loop")


def make_config(arch: str) -> Any:
    """A tiny config: 2-4 looped visits, a window shorter than the rows, 8 experts top-2."""
    from transformers import DoryConfig, HrmTextConfig
    from transformers.models.inkling2_loop.configuration_inkling2_loop import (
        Inkling2LoopTextConfig,
    )

    if arch == "hrm_text":
        return HrmTextConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, head_dim=8, H_cycles=2, L_cycles=2, max_position_embeddings=64,
        )  # fmt: skip
    if arch == "dory":
        return DoryConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=5,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, n_input_layers=1,
            n_output_layers=1, n_recurrent_loops=3, sliding_window=4, max_position_embeddings=64,
        )  # fmt: skip
    return Inkling2LoopTextConfig(
        vocab_size=VOCAB, unpadded_vocab_size=VOCAB, eos_token_id=None, hidden_size=32,
        num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=8,
        sliding_window_size=4, d_rel=4, rel_extent=8, moe_intermediate_size=16,
        n_routed_experts=8, num_experts_per_tok=2, n_layers_per_attn_res_block=2,
        loop_layer_index_start=2, loop_layer_index_end=4, loop_num_passes=3, loop_gate_rank=4,
        max_position_embeddings=64,
    )  # fmt: skip


def tiny_model(arch: str, seed: int = 0, config: Any = None) -> Any:
    """The HF model of make_config(arch) (or `config`), random weights from `seed`, eval mode."""
    import transformers

    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(config or make_config(arch)).eval()
    if arch == "inkling2_loop":  # random routers tie rarely; spread the sink logits
        with torch.no_grad():
            for layer in hf.model.layers:
                layer.self_attn.sink_proj.weight.normal_(0, 0.5)
    return hf


def tiny_tokenizer() -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` trained on Dyck-like text, whose post-processor
    adds a BOS (<s>, id 1) before a row's text, as released tokenizers do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["Input: ( [ { < > } ] ) Output: ) ]\n"] * 50, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    return tok


def tiny_folder(
    root: Path, arch: str, name: str | None = None, seed: int = 0, tokenizer: bool = False
) -> Path:
    """A model folder `root/name` (default: the architecture's name) holding tiny_model(arch)
    as save_pretrained writes it: config.json and safetensors, and no tokenizer (ids only), or
    with `tokenizer` tiny_tokenizer()'s tokenizer.json, the vocabulary sized to it and room for
    in-context Dyck prompts (512 positions)."""
    folder = Path(root) / (name or arch)
    config = make_config(arch)
    tok = tiny_tokenizer() if tokenizer else None
    if tok is not None:
        config.vocab_size = tok.get_vocab_size()
        if hasattr(config, "unpadded_vocab_size"):
            config.unpadded_vocab_size = config.vocab_size
        config.max_position_embeddings = 512
    tiny_model(arch, seed, config).save_pretrained(folder)
    if tok is not None:
        tok.save(str(folder / "tokenizer.json"))
    return folder


def tiny_folders(root: Path, archs: tuple[str, ...] = ARCHS) -> dict[str, Path]:
    """{arch: folder} of each architecture under `root`."""
    return {arch: tiny_folder(root, arch) for arch in archs}
