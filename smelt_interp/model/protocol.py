"""What a probe reads of a model: the structural protocol every looped model meets, this
project's SmeltModel and the transformers adapter (smelt_interp.adapters) alike.

A model has a shape (`cfg`: heads, the schedule of (layer, visit) in execution order, the loop
span, experts and top-k where it routes, the token at the first position) and per-visit hook
points under the names of `hook_name` (DESIGN.md), fired once per call of a layer, so
`run_with_cache` and nnsight see every visit apart. How a visit's attention rows are recovered
is the model's own, and its shape says which (`attention_source`): SmeltModel's rows are
recomputed from cached post-RoPE Q and K (its attention is plain causal softmax), an adapted
model's are read from its eager pattern, which already holds its masks, windows, position
biases and learned sinks. smelt_interp.measure turns a cache into rows either way."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from smelt_interp.config import Schedule


@runtime_checkable
class ModelShape(Protocol):
    """The fields of a model's shape that the probes, pages and notebooks read. ModelConfig
    meets it; an adapted model's shape is smelt_interp.adapters' LoopedShape."""

    name: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    n_experts: int  # 1 for a dense feed-forward: nothing to route
    top_k: int
    max_seq_len: int
    # Derived (properties of ModelConfig): execution order, whether any layer runs twice,
    # query heads per kv head, the layers that run more than once, len(schedule).
    schedule: Schedule
    is_looped: bool
    n_group: int
    looped_layers: tuple[int, ...]
    effective_depth: int
    loop_text: str  # the loops in words: 'layers 1..2 x 2', or 'none'
    # The token every row starts with (BOS), or None where the tokenizer adds none and the
    # first position of a row stands in for it.
    first_token_id: int | None
    # Whether attention has a learned sink slot: a logit outside the keys that takes mass (1
    # minus the rows' sum), the same mechanism as a BOS sink held by a parameter.
    learned_sinks: bool
    # 'qk': attention rows are recomputed from the cached post-RoPE hook_q and hook_k;
    # 'pattern': they are read from hook_pattern, the model's own eager weights.
    attention_source: str

    def visits_of(self, layer: int) -> int: ...


@runtime_checkable
class LoopedModel(Protocol):
    """A model the probes can measure visit by visit."""

    cfg: Any  # a ModelShape

    @property
    def schedule(self) -> Schedule: ...

    def check_tokens(
        self, tokens: torch.Tensor, past: int = 0, ids_checked: bool = False
    ) -> torch.Tensor: ...

    def hidden_keys(self, tokens: torch.Tensor) -> dict[int, torch.Tensor]:
        """Per layer that hides keys from recomputed rows, its [batch, pos] mask (or {})."""

    def unembed_resid(self, resid: torch.Tensor) -> torch.Tensor:
        """Logits read off a residual stream [.., d_model] through the model's own head (its
        final norm and unembedding), as if it were the last layer's output."""

    def run_with_cache(self, *args: Any, **kwargs: Any) -> Any: ...

    def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any: ...

    def parameters(self, recurse: bool = True) -> Any: ...
