"""Dense decoders of the Llama family (`llama`, `mistral`): pre-norm layers, each run once, or
a span of them again at inference (`adapters.inference_loop`).

Both model types build `model.layers` of decoder layers x + attn(norm(x)), then + mlp(norm(.)),
with RoPE inside attention and GQA, and walk them in one loop `layers[:num_hidden_layers]`
with one mask for all (mistral's sliding window included): what the loop needs. Qwen2 and later
index a per-layer mask type by loop position, so they are not covered."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from smelt_interp.adapters.inference_loop import ScheduledLayers
from smelt_interp.adapters.looped import Arch, Capture, Visit, fire, input_hook, output_hook
from smelt_interp.config import Schedule


def prenorm_writes(capture: Capture, number: int, layer: nn.Module) -> list[RemovableHandle]:
    """hook_attn_out (self_attn's output), hook_resid_mid (post_attention_layernorm's input)
    and hook_mlp_out (mlp's output) of a pre-norm layer, each replaceable; a replaced mid is
    carried to the layer's output by Arch.finish (the layer adds the MLP write to its own copy)."""

    def attn_out(cur: Visit, output: tuple[Any, ...]) -> Any:
        write, new = fire(cur.hooks.hook_attn_out, output[0])
        return (write, *output[1:]) if new else None

    def mid(cur: Visit, args: tuple[Any, ...]) -> Any:
        cur.mid, cur.mid_replaced = fire(cur.hooks.hook_resid_mid, args[0])
        return (cur.mid,) if cur.mid_replaced else None

    def mlp_out(cur: Visit, output: Any) -> Any:
        cur.mlp_out, new = fire(cur.hooks.hook_mlp_out, output)
        return cur.mlp_out if new else None

    return [
        layer.self_attn.register_forward_hook(output_hook(capture, number, attn_out)),
        layer.post_attention_layernorm.register_forward_pre_hook(input_hook(capture, number, mid)),
        layer.mlp.register_forward_hook(output_hook(capture, number, mlp_out)),
    ]


class Dense(Arch):
    """One visit per layer, or the schedule of an inference loop; the writes are the sublayer
    outputs (attention after o_proj), as in SmeltModel, with no 1/r scale."""

    model_types = ("llama", "mistral")
    loops = False  # its own config runs every layer once; a loop is added at inference

    def layers(self, hf: nn.Module) -> list[tuple[str, nn.Module]]:
        stack = hf.model.layers
        return [(f"model.layers.{i}", stack[i]) for i in range(len(stack))]

    def schedule(self, config: Any) -> Schedule:
        return tuple((layer, 0) for layer in range(config.num_hidden_layers))

    def shape(self, config: Any) -> dict[str, int]:
        heads = config.num_attention_heads
        return dict(
            d_model=config.hidden_size,
            n_heads=heads,
            n_kv_heads=config.num_key_value_heads or heads,
            d_head=getattr(config, "head_dim", None) or config.hidden_size // heads,
            n_experts=1,
            top_k=1,
            max_seq_len=config.max_position_embeddings,
        )

    def install(self, capture: Capture, number: int, layer: nn.Module) -> list[RemovableHandle]:
        return prenorm_writes(capture, number, layer)

    def set_schedule(self, hf: nn.Module, schedule: Schedule) -> None:
        """Make hf's forward walk its layers in `schedule` order (the same modules again)."""
        stack = hf.model.layers
        hf.model.layers = ScheduledLayers(
            [stack[i] for i in range(len(stack))], tuple(layer for layer, _ in schedule)
        )
