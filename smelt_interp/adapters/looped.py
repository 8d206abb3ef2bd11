"""The wrapper that gives a transformers looped model this project's per-visit hook points.

`LoopedAdapter` holds the HF model (`.hf`) and one `VisitHooks` per (layer, visit), named as
SmeltModel's (`blocks.{layer}.visits.{v}.*`). The HF model runs its own forward; plain torch
hooks on its modules find the visit (calls of that layer module so far in this forward pass)
and pass each tensor through the visit's hook point, returning what the hook point returns,
so run_with_cache sees every visit apart and run_with_hooks can edit it. Attention runs through
one registered `AttentionInterface` function ("smelt_capture") that calls the modeling module's
own eager attention and fires Q, K, V and the pattern; what differs per architecture (where a
sublayer's write and the mid residual are, the router) lives in an `Arch` (one module each)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from smelt_interp.config import Schedule
from smelt_interp.model.block import VisitHooks
from smelt_interp.model.protocol import VisitNaming

ATTN_IMPLEMENTATION = "smelt_capture"


# ----- the shape ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LoopedShape:
    """An adapted model's shape (meets smelt_interp.model.protocol.ModelShape). Layers are
    numbered per decoder-layer module (HRM: L stack 0..n-1, H stack n..2n-1)."""

    name: str
    arch: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    n_experts: int  # 1 for a dense feed-forward
    top_k: int
    max_seq_len: int
    schedule: Schedule
    first_token_id: int | None = None  # the tokenizer's BOS where it adds one, else None
    learned_sinks: bool = False
    attention_source: str = "pattern"
    layer_names: tuple[str, ...] = field(default=())  # each layer's module path in `.hf`

    @property
    def is_looped(self) -> bool:
        return any(self.visits_of(layer) > 1 for layer in range(self.n_layers))

    @property
    def n_group(self) -> int:
        """Query heads per key/value head (GQA ratio)."""
        return self.n_heads // self.n_kv_heads

    @property
    def looped_layers(self) -> tuple[int, ...]:
        return tuple(layer for layer in range(self.n_layers) if self.visits_of(layer) > 1)

    @property
    def effective_depth(self) -> int:
        return len(self.schedule)

    @property
    def loop_text(self) -> str:
        """The loops in words, as reports and pages show them: runs of consecutive layers with
        one visit count, e.g. 'layers 0..1 x 4, layers 2..3 x 2' for HRM, or 'none'."""
        runs: list[list[int]] = []
        for layer in self.looped_layers:
            if runs and runs[-1][1] == layer - 1 and runs[-1][2] == self.visits_of(layer):
                runs[-1][1] = layer
            else:
                runs.append([layer, layer, self.visits_of(layer)])
        return ", ".join(f"layers {a}..{b} x {n}" for a, b, n in runs) or "none"

    def visits_of(self, layer: int) -> int:
        """How many times `layer` runs in one forward pass."""
        return sum(1 for lay, _ in self.schedule if lay == layer)


# ----- one forward pass's visit state --------------------------------------------------------
@dataclass
class Visit:
    """The visit under way: its hook points and what later hooks of the same call need."""

    layer: int
    visit: int
    hooks: VisitHooks
    pre: torch.Tensor  # resid_pre as the layer reads it (after hook_resid_pre)
    mid: torch.Tensor | None = None  # resid_mid after hook_resid_mid
    mid_replaced: bool = False  # a hook replaced resid_mid: the layer output is rebuilt
    mlp_out: torch.Tensor | None = None


class Capture:
    """Visit counting for one adapter: which (layer, visit) is running, in which order the
    layers ran. A plain object (not a Module), so HF modules can point at it without cycles in
    the module tree."""

    def __init__(self, blocks: nn.ModuleList, d_head: int) -> None:
        self.blocks = blocks
        self.d_head = d_head
        self.counts: dict[int, int] = {}
        self.order: list[tuple[int, int]] = []
        self.current: Visit | None = None

    def reset(self) -> None:
        self.counts, self.order, self.current = {}, [], None

    def begin(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        visit = self.counts.get(layer, 0)
        self.counts[layer] = visit + 1
        self.order.append((layer, visit))
        visits = self.blocks[layer].visits
        if visit >= len(visits):
            raise RuntimeError(
                f"layer {layer} ran {visit + 1} times in one forward pass; its schedule "
                f"allows {len(visits)} (the adapter's schedule does not match the model)"
            )
        hooks = visits[visit]
        pre = hooks.hook_resid_pre(x)
        self.current = Visit(layer, visit, hooks, pre)
        return pre

    def at(self, layer: int) -> Visit | None:
        """The running visit if it is of `layer` (None outside the adapter's forward)."""
        cur = self.current
        return cur if cur is not None and cur.layer == layer else None


def fire(hook: HookPoint, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Pass `x` through a hook point; (value, whether a hook replaced it)."""
    y = hook(x)
    return y, y is not x


# ----- attention ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Tap:
    """What an HF attention module carries so the capture function finds its visit."""

    capture: Capture
    layer: int


def _eager(module: nn.Module) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The modeling module's own eager attention (its masks, biases and sinks, as it runs)."""
    return sys.modules[type(module).__module__].eager_attention_forward  # type: ignore[no-any-return]


def capture_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The "smelt_capture" attention: the module's eager attention with the visit's hook_q,
    hook_k, hook_v (HF's [b, H, T, d] as [b, T, H, d]; K and V before repeat_kv) and
    hook_pattern (the eager weights over the real keys) fired and replaceable. Modules with no
    tap (Inkling's attention residuals) and calls outside a visit run eager attention as is."""
    eager = _eager(module)
    tap: Tap | None = getattr(module, "_smelt_tap", None)
    cur = tap.capture.at(tap.layer) if tap is not None else None
    if cur is None:
        return eager(module, query, key, value, attention_mask, **kwargs)
    hooks = cur.hooks.attn
    q, q_new = fire(hooks.hook_q, query.transpose(1, 2))
    k, k_new = fire(hooks.hook_k, key.transpose(1, 2))
    v, v_new = fire(hooks.hook_v, value.transpose(1, 2))
    query = q.transpose(1, 2) if q_new else query
    key = k.transpose(1, 2) if k_new else key
    value = v.transpose(1, 2) if v_new else value
    out, weights = eager(module, query, key, value, attention_mask, **kwargs)
    pattern, p_new = fire(hooks.hook_pattern, weights)
    if p_new:  # the edited pattern mixes the values (eval mode: no dropout)
        groups = pattern.shape[1] // value.shape[1]
        mixed = pattern.to(value.dtype) @ value.repeat_interleave(groups, dim=1)
        out, weights = mixed.transpose(1, 2).contiguous(), pattern
    return out, weights


def register_attention() -> None:
    """Register "smelt_capture" with transformers (attention function and its eager mask)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, capture_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)


# ----- what differs per architecture ---------------------------------------------------------
class Arch:
    """One architecture's structure: its layer modules by number, its schedule, its shape, and
    where its sublayer writes are. Subclasses live one module each."""

    model_types: tuple[str, ...] = ()
    learned_sinks = False
    loops = True  # its config loops layers itself: no loop is added at inference

    def auto_class(self, model_type: str) -> str:
        """The transformers Auto class that builds a folder of `model_type`."""
        return "AutoModelForCausalLM"

    def layers(self, hf: nn.Module) -> list[tuple[str, nn.Module]]:
        """(module path, decoder-layer module) by layer number."""
        raise NotImplementedError

    def schedule(self, config: Any) -> Schedule:
        """(layer, visit) in execution order, from the config."""
        raise NotImplementedError

    def loop_counts(self, config: Any) -> dict[str, Any]:
        """{config key: value} of every loop count the config declares, nested loops all named:
        the loader checks them against its caps before `schedule` is built. None by default."""
        return {}

    def shape(self, config: Any) -> dict[str, int]:
        """d_model, n_heads, n_kv_heads, d_head, n_experts, top_k, max_seq_len."""
        raise NotImplementedError

    def attention(self, layer: nn.Module) -> nn.Module:
        return layer.self_attn

    def out_proj(self, layer: nn.Module) -> nn.Module:
        """The linear map whose input is the heads' outputs side by side (hook_z)."""
        return layer.self_attn.o_proj

    def install(self, capture: Capture, number: int, layer: nn.Module) -> list[RemovableHandle]:
        """Hooks on the layer's submodules that fire hook_attn_out, hook_resid_mid, hook_mlp_out
        (and routing), each replaceable."""
        raise NotImplementedError

    def final_norm(self, hf: nn.Module) -> nn.Module:
        """The norm between the last layer's output and the head."""
        return hf.model.norm

    def unembed(self, hf: nn.Module, resid: torch.Tensor) -> torch.Tensor:
        """Logits of a residual stream through the model's final norm and head."""
        return hf.lm_head(self.final_norm(hf)(resid))

    def finish(self, cur: Visit, out: torch.Tensor) -> torch.Tensor:
        """The layer's output once its hooks ran (rebuilt where a hook replaced resid_mid)."""
        if cur.mid_replaced and cur.mlp_out is not None and cur.mid is not None:
            return (cur.mid + cur.mlp_out).to(out.dtype)
        return out


def output_hook(
    capture: Capture, number: int, fn: Callable[[Visit, Any], Any]
) -> Callable[[nn.Module, Any, Any], Any]:
    """A forward hook that runs `fn(visit, output)` during a visit of layer `number`."""

    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        cur = capture.at(number)
        return None if cur is None else fn(cur, output)

    return hook


def input_hook(
    capture: Capture, number: int, fn: Callable[[Visit, tuple[Any, ...]], Any]
) -> Callable[[nn.Module, Any], Any]:
    """A forward pre-hook that runs `fn(visit, args)` during a visit of layer `number`."""

    def hook(module: nn.Module, args: tuple[Any, ...]) -> Any:
        cur = capture.at(number)
        return None if cur is None else fn(cur, args)

    return hook


# ----- the adapter ---------------------------------------------------------------------------
class VisitBlock(nn.Module):
    """`blocks.{layer}`: the hook points of each visit of one HF layer (parameter-free)."""

    def __init__(self, n_visits: int) -> None:
        super().__init__()
        self.visits = nn.ModuleList(VisitHooks() for _ in range(n_visits))


class LoopedAdapter(VisitNaming, HookedRootModule):
    """A transformers looped LM with per-visit hook points (see the package docstring). It owns
    `hf`: adapting switches hf's attention to "smelt_capture" and adds hooks to its modules."""

    def __init__(self, hf: nn.Module, arch: Arch, cfg: LoopedShape) -> None:
        super().__init__()
        self.hf = hf
        self.arch = arch
        self.cfg = cfg
        self.blocks = nn.ModuleList(VisitBlock(cfg.visits_of(n)) for n in range(cfg.n_layers))
        self.hook_embed = HookPoint()
        self.hook_resid_final = HookPoint()
        self.capture = Capture(self.blocks, cfg.d_head)
        self._handles: list[RemovableHandle] = []
        self._install()
        self.setup()

    # ----- structure -------------------------------------------------------------------
    def layer_module(self, layer: int) -> nn.Module:
        """The HF decoder-layer module numbered `layer`."""
        return self.hf.get_submodule(self.cfg.layer_names[layer])

    # ----- forward -----------------------------------------------------------------------
    def hidden_keys(self, tokens: torch.Tensor) -> dict[int, torch.Tensor]:
        """No layer hides keys from recomputed rows: the patterns are the model's own."""
        return {}

    def unembed_resid(self, resid: torch.Tensor) -> torch.Tensor:
        """Logits [.., vocab] (float) read off a residual stream [.., d_model] as if it were the
        last layer's output: the model's final norm and head (the logit lens; see each Arch)."""
        return self.arch.unembed(self.hf, resid).float()

    # What measure.depth_cache reads to rename visits by depth and attribute logits: the final
    # norm and the unembedding (a linear head), and each layer's output projection, whose
    # input is hook_z (the adapter's writes carry no 1/r scale).
    @property
    def final_norm(self) -> nn.Module:
        return self.arch.final_norm(self.hf)

    @property
    def unembed_weight(self) -> torch.Tensor:
        return self.hf.get_output_embeddings().weight

    @property
    def unembed_bias(self) -> torch.Tensor | None:
        return self.hf.get_output_embeddings().bias

    def out_proj(self, layer: int) -> nn.Module:
        """The linear map of layer `layer` whose input is its heads' outputs (hook_z)."""
        return self.arch.out_proj(self.layer_module(layer))

    @torch.no_grad()
    def generate(
        self, tokens: torch.Tensor, max_new_tokens: int, temperature: float = 0.0
    ) -> torch.Tensor:
        """Extend equal-length rows greedily (temperature 0) by max_new_tokens, recomputing the
        whole prefix each step (no KV cache: the looped layers' caches are each model's own)."""
        if temperature != 0.0:
            raise ValueError("an adapted model decodes greedily only (temperature 0)")
        out = self.check_tokens(tokens)
        self.check_tokens(out[:, :1], past=out.shape[1] + max_new_tokens - 1)  # fits in all
        # only the last position's logits: unembedding every position of every step into a
        # 49k vocabulary costs SmolLM2 about a fifth of its greedy decoding
        last = {"logits_to_keep": 1} if self._keeps_last_logits() else {}
        for _ in range(max_new_tokens):
            nxt = self(out, **last)[:, -1].argmax(dim=-1, keepdim=True)
            out = torch.cat([out, nxt.to(out.device)], dim=1)
        return out

    def _keeps_last_logits(self) -> bool:
        """Whether the HF forward can return the last positions' logits alone (Llama-family
        models and most others of transformers 5 take `logits_to_keep`)."""
        return "logits_to_keep" in inspect.signature(self.hf.forward).parameters

    def forward(self, tokens: torch.Tensor, **hf_kwargs: Any) -> torch.Tensor:
        """tokens [batch, pos] -> logits [batch, pos, vocab] (float). `hf_kwargs` go to the HF
        forward (e.g. HRM's token_type_ids for its prefix-LM mask)."""
        tokens = self.check_tokens(tokens)
        tokens = tokens.to(self.hf.get_input_embeddings().weight.device)
        self.capture.reset()
        try:
            out = self.hf(input_ids=tokens, use_cache=False, **hf_kwargs)
        finally:
            order, self.capture.current = list(self.capture.order), None
        if tuple(order) != self.schedule:
            raise RuntimeError(
                f"{self.cfg.name}: the layers ran in an order the adapter's schedule does not "
                f"hold ({order[:6]}... against {list(self.schedule[:6])}...)"
            )
        return out.logits.float()

    # ----- wiring ------------------------------------------------------------------------
    def _install(self) -> None:
        """Switch hf to the capture attention and hook its modules."""
        layers = [self.hf.get_submodule(name) for name in self.cfg.layer_names]
        if any(hasattr(self.arch.attention(layer), "_smelt_tap") for layer in layers):
            raise ValueError(f"{self.cfg.name}: this model is adapted already (hooks would repeat)")
        register_attention()
        # the config the decoder layers (and their masks) read: the whole config, or an
        # image-text model's text config (its setter would carry to the vision tower too)
        for config in {id(c): c for c in (self.arch.attention(m).config for m in layers)}.values():
            config._attn_implementation = ATTN_IMPLEMENTATION
        cap, add = self.capture, self._handles.append
        emb = self.hf.get_input_embeddings()
        add(emb.register_forward_hook(lambda m, a, out: self.hook_embed(out)))
        head = self.hf.get_output_embeddings()
        add(head.register_forward_pre_hook(lambda m, args: (self.hook_resid_final(args[0]),)))
        for number, layer in enumerate(layers):
            self.arch.attention(layer)._smelt_tap = Tap(cap, number)
            add(layer.register_forward_pre_hook(self._begin(number), with_kwargs=True))
            add(layer.register_forward_hook(self._end(number)))
            add(self.arch.out_proj(layer).register_forward_pre_hook(_z_hook(cap, number)))
            self._handles += self.arch.install(cap, number, layer)

    def _begin(self, number: int) -> Callable[..., Any]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if "hidden_states" in kwargs:
                kwargs = {
                    **kwargs,
                    "hidden_states": self.capture.begin(number, kwargs["hidden_states"]),
                }
                return args, kwargs
            return (self.capture.begin(number, args[0]), *args[1:]), kwargs

        return hook

    def _end(self, number: int) -> Callable[..., Any]:
        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
            cur = self.capture.at(number)
            if cur is None:
                return output
            out = cur.hooks.hook_resid_post(self.arch.finish(cur, output))
            self.capture.current = None
            return out

        return hook


def _z_hook(capture: Capture, number: int) -> Callable[[nn.Module, Any], Any]:
    """hook_z: the output projection's input viewed as [b, T, H, d_head]."""

    def fn(cur: Visit, args: tuple[Any, ...]) -> Any:
        x = args[0]
        heads = x.view(*x.shape[:-1], -1, capture.d_head)
        z, new = fire(cur.hooks.attn.hook_z, heads)
        return (z.reshape(x.shape), *args[1:]) if new else None

    return input_hook(capture, number, fn)
