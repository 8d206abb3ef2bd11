"""Dory (`dory`): an nGPT-style looped transformer on the unit sphere.

Input layers run once, the recurrent layers `n_recurrent_loops` times as a block (each loop
restarting from norm(h) + the input section's output), then the output layers once. A layer
does not add its sublayers' outputs: it normalises its input, then moves the state towards each
normalised sublayer output at a learned per-channel rate, h + a * (norm(attn) - h)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from smelt_interp.adapters.looped import Arch, Capture, Visit, fire, input_hook
from smelt_interp.config import Schedule


class Dory(Arch):
    """The writes are differences of the residual: hook_attn_out = resid_mid - resid_pre (the
    input normalisation and the attention interpolation together), hook_mlp_out = resid_post -
    resid_mid, so resid_pre + attn_out + mlp_out = resid_post. resid_mid is the state after
    the attention interpolation (the input of pre_feedforward_layernorm)."""

    model_types = ("dory",)

    def layers(self, hf: nn.Module) -> list[tuple[str, nn.Module]]:
        return [(f"model.layers.{i}", layer) for i, layer in enumerate(hf.model.layers)]

    def loop_counts(self, config: Any) -> dict[str, Any]:
        return {"n_recurrent_loops": config.n_recurrent_loops}

    def schedule(self, config: Any) -> Schedule:
        start = config.n_input_layers
        end = start + config.n_recurrent_layers
        order = [(layer, 0) for layer in range(start)]
        for loop in range(config.n_recurrent_loops):
            order += [(layer, loop) for layer in range(start, end)]
        out_start = config.num_hidden_layers - config.n_output_layers
        return tuple(order + [(layer, 0) for layer in range(out_start, config.num_hidden_layers)])

    def shape(self, config: Any) -> dict[str, int]:
        return dict(
            d_model=config.hidden_size,
            n_heads=config.num_attention_heads,
            n_kv_heads=config.num_key_value_heads,
            d_head=config.head_dim,
            n_experts=1,
            top_k=1,
            max_seq_len=config.max_position_embeddings,
        )

    # final_norm and unembed: Arch's (model.norm, then lm_head, which holds the per-token logit
    # scale, so it is no plain linear head and measure.depth_cache refuses its attribution)

    def install(self, capture: Capture, number: int, layer: nn.Module) -> list[RemovableHandle]:
        def mid(cur: Visit, args: tuple[Any, ...]) -> Any:
            state = args[0]
            write = state - cur.pre
            edited, new = fire(cur.hooks.hook_attn_out, write)
            cur.mid = cur.pre + edited if new else state
            cur.mid, replaced = fire(cur.hooks.hook_resid_mid, cur.mid)
            return (cur.mid,) if new or replaced else None

        return [
            layer.pre_feedforward_layernorm.register_forward_pre_hook(
                input_hook(capture, number, mid)
            )
        ]

    def finish(self, cur: Visit, out: torch.Tensor) -> torch.Tensor:
        assert cur.mid is not None  # set by the pre-feed-forward hook of this visit
        write = out - cur.mid
        edited, new = fire(cur.hooks.hook_mlp_out, write)
        return cur.mid + edited if new else out
