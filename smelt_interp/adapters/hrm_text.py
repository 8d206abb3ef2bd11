"""HRM-Text (`hrm_text`): two stacks of plain pre-norm layers called in a nested loop.

For each of H_cycles high cycles the L stack runs L_cycles times, then the H stack once, so an
L layer runs H_cycles * L_cycles times and an H layer H_cycles times. Both stacks number their
layers 0..n-1 (`layer_idx`, also in their cache slots); here the L stack's layers are 0..n-1 and
the H stack's n..2n-1, so every decoder-layer module has its own number."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from smelt_interp.adapters.dense import prenorm_writes
from smelt_interp.adapters.looped import Arch, Capture
from smelt_interp.config import Schedule


class HrmText(Arch):
    """Residual: x + attn(norm(x)), then + mlp(norm(.)): the writes are the sublayer outputs
    (attention after its sigmoid gate and o_proj), as in SmeltModel."""

    model_types = ("hrm_text",)

    def layers(self, hf: nn.Module) -> list[tuple[str, nn.Module]]:
        return [
            (f"model.{stack}.layers.{i}", layer)
            for stack in ("L_module", "H_module")
            for i, layer in enumerate(getattr(hf.model, stack).layers)
        ]

    def loop_counts(self, config: Any) -> dict[str, Any]:
        return {"H_cycles": config.H_cycles, "L_cycles": config.L_cycles}

    def schedule(self, config: Any) -> Schedule:
        n = config.num_layers_per_stack
        order: list[tuple[int, int]] = []
        for high in range(config.H_cycles):
            for low in range(config.L_cycles):
                order += [(layer, high * config.L_cycles + low) for layer in range(n)]
            order += [(n + layer, high) for layer in range(n)]
        return tuple(order)

    def shape(self, config: Any) -> dict[str, int]:
        heads = config.num_attention_heads  # multi-head: as many key/value heads as queries
        return dict(
            d_model=config.hidden_size,
            n_heads=heads,
            n_kv_heads=heads,
            d_head=config.head_dim,
            n_experts=1,
            top_k=1,
            max_seq_len=config.max_position_embeddings,
        )

    def final_norm(self, hf: nn.Module) -> nn.Module:
        return hf.model.H_module.final_norm  # the H stack's norm ends the model

    def install(self, capture: Capture, number: int, layer: nn.Module) -> list[RemovableHandle]:
        return prenorm_writes(capture, number, layer)
