"""Per-visit analysis of transformers' looped language models: HRM-Text (`hrm_text`), Dory
(`dory`) and Inkling2Loop (`inkling2_loop`), loaded from a local folder; and of dense
Llama-family decoders (`llama`, `mistral`: adapters.dense), as they are or with a span of their
own layers looped at inference (adapters.inference_loop: `load_looped(folder, loop=Loop(12,
18))`, FOLDER@12:18x2 on a command line), the real pretrained one among them prepared by
`make real-lm` (adapters.real_lm).

`load_looped(folder)` (or `adapt(hf_model)`) returns a `LoopedAdapter`: a TransformerLens
HookedRootModule around the HF model with the hook points of model.protocol.hook_name (the
hook-name contract of docs/design.md), one set per (layer, visit), each fired once per forward
pass, so run_with_cache and nnsight see every visit apart.
Layers are numbered per decoder-layer module (HRM's L stack 0..n-1, H stack n..2n-1; Dory and
Inkling by their own index); `visit` counts that module's calls in one forward pass.

Every architecture: hook_resid_pre / hook_resid_post are the decoder layer's input / output;
hook_q [b, T, H, d] (after each model's RoPE / norms / scales), hook_k and hook_v [b, T, H_kv, d]
(before repeat_kv) and hook_pattern [b, H, T, T] are the arguments and eager weights of the
model's own eager attention (AttentionInterface "smelt_capture"), so the pattern holds the
model's additive mask, window, position bias and sinks; hook_z is the output projection's input
per head (after any output gate); hook_embed the embedding module's output; hook_resid_final
lm_head's input. Every hook point's return value replaces the tensor (the pattern then mixes
the values itself), except Inkling's hook_router_logits, a record only.

    hook / what      hrm_text               dory                      inkling2_loop
    hook_attn_out    self_attn output (1)   resid_mid - resid_pre     attention conv output (2)
    hook_resid_mid   pre + attn_out         after the interpolation   pre + attn_out (3)
    hook_mlp_out     MLP output             resid_post - resid_mid    MoE conv output (2)
    pattern masks    causal; prefix-LM (4)  causal; sliding window    causal; window; rel. bias (5)
    routing          dense (n_experts 1)    dense (n_experts 1)       router outputs (6)
    learned sink     none                   none                      sink_proj logit (7)

(1) after the sigmoid output gate and o_proj. (2) the post-attention / post-MLP short
convolution's output: what the layer adds to its partial block sum. (3) at a block's first
layer the sum restarts: resid_mid = attn_out. (4) causal; with token_type_ids passed to forward,
the prefix block is bidirectional. (5) window on hybrid_sliding layers; the relative position
bias is added to the logits before the mask. (6) hook_router_logits [b, T, E] (record only),
hook_expert_indices [b, T, top_k], hook_expert_weights = the router's weights divided by
routed_scaling_factor (they sum to 1). (7) one logit per (query, head) beside the keys: its
mass is 1 - the pattern row's sum (the pattern holds the real keys only).
First token: the tokenizer's BOS id where the folder's tokenizer adds one; otherwise (no
tokenizer, as in a tiny random folder, or none added) first_token_id is None and the sink
measurement starts at the first position.

Dory's residual interpolates nGPT-style (h + a * (norm(update) - h)), so its writes are defined
as differences of the residual; Inkling's layer input is an attention over block states, and
its residual is the partial block sum. Unlike SmeltModel the pattern is always materialised
(eager attention; attention_source "pattern"), and there is no KV cache or 1/r write scale."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smelt_interp.adapters.load import adapt, known_archs, load_looped, register_arch
    from smelt_interp.adapters.looped import Arch, LoopedAdapter, LoopedShape

__all__ = [
    "Arch",
    "LoopedAdapter",
    "LoopedShape",
    "adapt",
    "is_looped_folder",
    "known_archs",
    "load_looped",
    "register_arch",
]
_LAZY = {
    "adapt": "load",
    "known_archs": "load",
    "load_looped": "load",
    "register_arch": "load",
    "Arch": "looped",
    "LoopedAdapter": "looped",
    "LoopedShape": "looped",
}


def is_looped_folder(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a transformers model folder (a directory holding config.json), as
    opposed to a ckpt.pt. Cheap: it imports no transformers code."""
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


def __getattr__(name: str) -> Any:
    # the rest imports transformers' modeling code (seconds): only when first used
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
