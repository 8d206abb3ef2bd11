"""What a probe reads of a model: the structural protocol every looped model meets, this
project's SmeltModel and the transformers adapter (smelt_interp.adapters) alike.

A model has a shape (`cfg`: heads, the schedule of (layer, visit) in execution order, the loop
span, experts and top-k where it routes, the token at the first position) and per-visit hook
points under the names of `hook_name` (docs/design.md, "The hook-name contract"), fired once per
call of a layer, so `run_with_cache` and nnsight see every visit apart. How a visit's attention
rows are recovered is the model's own, and its shape says which (`attention_source`):
SmeltModel's rows are recomputed from cached post-RoPE Q and K (its attention is plain causal
softmax), an adapted model's are read from its eager pattern, which already holds its masks,
windows, position biases and learned sinks. smelt_interp.measure turns a cache into rows either
way."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from smelt_interp.config import Schedule
from smelt_interp.errors import TokenError


def autocast_for(device: torch.device) -> torch.autocast:
    """The autocast this model runs under on `device`, in training and in every probe: bf16 on
    CUDA, where the grouped expert kernels take only bf16 (in float32 the per-expert loop runs,
    one host sync per expert per visit) and fused attention wants it too; off on the CPU, so CPU
    runs stay float32, bitwise reproducible and comparable with float64 references."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


VISIT_HOOKS = (
    "hook_resid_pre",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.hook_pattern",
    "attn.hook_z",
    "hook_attn_out",
    "hook_resid_mid",
    "moe.hook_router_logits",
    "moe.hook_expert_indices",
    "moe.hook_expert_weights",
    "hook_mlp_out",
    "hook_resid_post",
)


def hook_name(layer: int, visit: int, name: str) -> str:
    """Full hook-point name of one visit, e.g. hook_name(2, 1, "attn.hook_q")."""
    if name not in VISIT_HOOKS:
        raise KeyError(f"unknown per-visit hook {name!r}; expected one of {', '.join(VISIT_HOOKS)}")
    return f"blocks.{layer}.visits.{visit}.{name}"


def validate_tokens(
    tokens: Any, shape: Any, past: int = 0, ids_checked: bool = False
) -> torch.Tensor:
    """Token ids checked against a model's shape (its vocab_size and max_seq_len), as a
    [batch, pos] long tensor; a TokenError line otherwise. `past`: positions already cached
    before these. `ids_checked`: the caller checked the id range on the CPU already (the
    trainer's batches), so no value is read back from the device here."""
    if not isinstance(tokens, torch.Tensor):
        tokens = torch.as_tensor(tokens)
    if tokens.dim() == 1:
        tokens = tokens[None]
    if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
        raise TokenError(
            f"tokens must be an integer [batch, pos] tensor, got "
            f"{tuple(tokens.shape)} {tokens.dtype}"
        )
    # The id range check reads values back to the host: skipped inside a compiled graph,
    # where it would force a sync and a graph break (the eager path keeps it).
    check_range = tokens.numel() and not ids_checked and not torch.compiler.is_compiling()
    if check_range and (int(tokens.min()) < 0 or int(tokens.max()) >= shape.vocab_size):
        raise TokenError(
            f"token ids must lie in 0..{shape.vocab_size - 1}, got "
            f"{int(tokens.min())}..{int(tokens.max())}"
        )
    if past + tokens.shape[1] > shape.max_seq_len:
        raise TokenError(
            f"sequence of {past + tokens.shape[1]} tokens exceeds the model's "
            f"max_seq_len {shape.max_seq_len}"
        )
    return tokens.long()


class VisitNaming:
    """What every looped model with per-visit hook points shares (SmeltModel and the
    transformers adapter): its schedule, read from `cfg`, and the hook names of one visit."""

    cfg: Any

    @property
    def schedule(self) -> Schedule:
        """(layer, visit) pairs in execution order."""
        return self.cfg.schedule

    @staticmethod
    def hook_name(layer: int, visit: int, name: str) -> str:
        return hook_name(layer, visit, name)

    def hook_names(self, name: str) -> list[str]:
        """`name` at every (layer, visit), in execution order."""
        return [hook_name(layer, visit, name) for layer, visit in self.schedule]

    def check_tokens(
        self, tokens: torch.Tensor, past: int = 0, ids_checked: bool = False
    ) -> torch.Tensor:
        """Validate ids and length against `cfg` (validate_tokens); a [batch, pos] long tensor."""
        return validate_tokens(tokens, self.cfg, past, ids_checked)


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
