"""Inkling2Loop (`inkling2_loop`, its text model `inkling2_loop_text`): a looped MoE with
attention residuals, learned attention sinks and a relative position bias.

Layers loop_layer_index_start .. end - 1 run loop_num_passes times as a block; each later pass
restarts from the state before the loop and receives messages from the previous pass. Layers
are grouped into blocks of n_layers_per_attn_res_block: a layer's input is not the residual
stream but an attention over the finished blocks' states and the current partial block sum
(`attention_input`, `mlp_input`), and the first layer of a block moves the partial sum into
the block states and starts a new one."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from smelt_interp.adapters.looped import Arch, Capture, Visit, fire, input_hook, output_hook
from smelt_interp.config import Schedule


class Inkling(Arch):
    """The residual is the partial block sum the layer receives and returns. hook_attn_out is
    the attention sublayer's write (after its gate, o_proj and post-attention convolution),
    hook_resid_mid = resid_pre + attn_out (at a block's first layer: attn_out alone, the block
    restarts), hook_mlp_out the MoE write (after its convolution), resid_post = mid + mlp_out.
    Routing from the router's own outputs; hook_expert_weights are the router's weights divided
    by routed_scaling_factor (they sum to 1), the experts use them times that factor."""

    model_types = ("inkling2_loop", "inkling2_loop_text")
    learned_sinks = True

    def auto_class(self, model_type: str) -> str:
        # a released checkpoint is the image-text model; its language model is what runs here
        return (
            "AutoModelForImageTextToText"
            if model_type == "inkling2_loop"
            else super().auto_class(model_type)
        )

    def text_model(self, hf: nn.Module) -> nn.Module:
        return hf.model.language_model if hasattr(hf.model, "language_model") else hf.model

    def layers(self, hf: nn.Module) -> list[tuple[str, nn.Module]]:
        text = self.text_model(hf)
        prefix = "model.language_model" if text is not hf.model else "model"
        return [(f"{prefix}.layers.{i}", layer) for i, layer in enumerate(text.layers)]

    def loop_counts(self, config: Any) -> dict[str, Any]:
        return {"loop_num_passes": config.get_text_config().loop_num_passes}

    def schedule(self, config: Any) -> Schedule:
        config = config.get_text_config()
        start, end = config.loop_layer_index_start, config.loop_layer_index_end
        order = [(layer, 0) for layer in range(start)]
        for loop in range(config.loop_num_passes):
            order += [(layer, loop) for layer in range(start, end)]
        return tuple(order + [(layer, 0) for layer in range(end, config.num_hidden_layers)])

    def shape(self, config: Any) -> dict[str, int]:
        config = config.get_text_config()
        full = (config.num_attention_heads, config.num_key_value_heads, config.head_dim)
        swa = (config.swa_num_attention_heads, config.swa_num_key_value_heads, config.swa_head_dim)
        if full != swa:
            raise ValueError(
                f"sliding and full attention layers differ in heads {swa} against {full}; the "
                "adapter needs one head shape"
            )
        return dict(
            d_model=config.hidden_size,
            n_heads=full[0],
            n_kv_heads=full[1],
            d_head=full[2],
            n_experts=config.n_routed_experts,
            top_k=config.num_experts_per_tok,
            max_seq_len=config.max_position_embeddings,
        )

    def final_norm(self, hf: nn.Module) -> nn.Module:
        return self.text_model(hf).norm

    def unembed(self, hf: nn.Module, resid: torch.Tensor) -> torch.Tensor:
        # the model's last step, final_input (an attention over the block states), needs the
        # block states: skipped, so this is the final norm, the head and the logit softcap
        return hf.logit_softcap(hf.lm_head(self.final_norm(hf)(resid)).float())

    def out_proj(self, layer: nn.Module) -> nn.Module:
        return layer.self_attn.o_proj.linear  # after the sigmoid gate on the heads' outputs

    def install(self, capture: Capture, number: int, layer: nn.Module) -> list[RemovableHandle]:
        router = layer.mlp.gate
        scale = float(router.routed_scaling_factor)

        def attn_out(cur: Visit, output: Any) -> Any:
            write, new = fire(cur.hooks.hook_attn_out, output)
            return write if new else None

        def mid(cur: Visit, args: tuple[Any, ...]) -> Any:
            # mlp_input(block_states, partial sum): the layer keeps its own copy of the partial
            # sum for the output, so a replaced mid is carried there by Arch.finish
            cur.mid, cur.mid_replaced = fire(cur.hooks.hook_resid_mid, args[1])
            return (args[0], cur.mid) if cur.mid_replaced else None

        def routing(cur: Visit, output: tuple[Any, ...]) -> Any:
            logits, weights, indices = output
            batch, pos = cur.pre.shape[:2]
            moe = cur.hooks.moe
            _, new_l = fire(moe.hook_router_logits, logits.view(batch, pos, -1))
            idx, new_i = fire(moe.hook_expert_indices, indices.view(batch, pos, -1))
            w, new_w = fire(moe.hook_expert_weights, weights.view(batch, pos, -1) / scale)
            if not (new_i or new_w):
                return None  # the experts read indices and weights; the logits are a record
            idx = idx.reshape(indices.shape)
            return logits, (w.reshape(weights.shape) * scale if new_w else weights), idx

        def mlp_out(cur: Visit, output: Any) -> Any:
            cur.mlp_out, new = fire(cur.hooks.hook_mlp_out, output)
            return cur.mlp_out if new else None

        return [
            layer.post_attention_convolution.register_forward_hook(
                output_hook(capture, number, attn_out)
            ),
            layer.mlp_input.register_forward_pre_hook(input_hook(capture, number, mid)),
            router.register_forward_hook(output_hook(capture, number, routing)),
            layer.post_mlp_convolution.register_forward_hook(output_hook(capture, number, mlp_out)),
        ]
