"""Kernel switches: other ways of computing the same model, for speed on a GPU. Each is off by
default and leaves outputs and gradients equal to the default path within float rounding
(tests/model/test_kernels.py), the state dict unchanged and every hook point firing once per
visit with the same shape.

- `sdpa_priority`: the order in which a GPU tries the fused attention backends (flash, cudnn,
  efficient, math); the ones not named follow in torch's order, so it never refuses a shape.
- `log_sdpa`: log which backend each new attention shape takes (eager passes; a compiled visit
  is traced, not run, so its choice is `sdpa_backend`'s to report).
- `moe_gather`: the MoE's permutation without atomics: tokens go to their sorted slots and come
  back by gathering through the inverse permutation, in both directions, and the router's
  weight scales the hidden rows before the down projection (a linear map, so the same sum).
- `weight_cache`: the low-precision copies of the weights (the experts' concatenated gate/up
  and down, the attention projections under autocast) made once per optimizer step and reused
  by every visit and micro-batch; each use still sends its gradient back in the weights' own
  dtype, so gradients sum as before. Only in training passes that run eagerly.
- `fused_qkv`: one projection for q, k and v, over W_q, W_k and W_v's concatenated rows; the
  three stay separate parameters, so checkpoints keep their keys.
- `compile_fullgraph`, `compile_mode`: options of the compiled training visit."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.optim.optimizer import register_optimizer_step_post_hook

from smelt_interp.errors import ConfigError
from smelt_interp.fields import bool_field, check_fields, choice_field, shown

SDPA_BACKENDS: dict[str, SDPBackend] = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
BACKEND_NAMES = {backend: name for name, backend in SDPA_BACKENDS.items()}
TORCH_ORDER = ("flash", "efficient", "math", "cudnn")  # torch's own priority (on CUDA)
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
LOG = logging.getLogger("smelt_interp.kernels")
M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class KernelOptions:
    """The switches (see the module's docstring); the training config's `kernels` section."""

    sdpa_priority: tuple[str, ...] = ()
    log_sdpa: bool = bool_field(False)
    moe_gather: bool = bool_field(False)
    weight_cache: bool = bool_field(False)
    fused_qkv: bool = bool_field(False)
    compile_fullgraph: bool = bool_field(False)
    compile_mode: str = choice_field("default", COMPILE_MODES)

    def __post_init__(self) -> None:
        if isinstance(self.sdpa_priority, list):  # as JSON gives it
            object.__setattr__(self, "sdpa_priority", tuple(self.sdpa_priority))
        check_fields(self, prefix="kernels.")
        names = self.sdpa_priority
        if (
            not isinstance(names, tuple)
            or not all(isinstance(n, str) and n in SDPA_BACKENDS for n in names)
            or len(set(names)) != len(names)
        ):
            raise ConfigError(
                f"kernels.sdpa_priority must be a list of distinct backends among "
                f"{', '.join(SDPA_BACKENDS)}, got {shown(names)}"
            )

    def apply(self, model: M) -> M:
        """`model` with these switches set on its modules (apply_kernels)."""
        return apply_kernels(model, self)

    def compile_options(self) -> dict[str, Any]:
        """torch.compile's keyword arguments for these options (none at the defaults)."""
        out: dict[str, Any] = {}
        if self.compile_fullgraph:
            out["fullgraph"] = True
        if self.compile_mode != "default":
            out["mode"] = self.compile_mode
        return out


DEFAULT = KernelOptions()


def apply_kernels(model: M, options: KernelOptions) -> M:
    """Set `options` on every attention and expert module of `model`; returns the model."""
    for module in model.modules():
        if hasattr(module, "kernels"):
            module.kernels = options
    if options.log_sdpa and not LOG.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        LOG.addHandler(handler)
        LOG.setLevel(logging.INFO)
    return model


# ----- attention backends -----------------------------------------------------------------


def priority(names: Sequence[str]) -> list[SDPBackend]:
    """The backends in the order to try: `names` first, then the rest in torch's order. Only
    CUDA reads the order; a CPU picks among the enabled backends by its own rule."""
    return [SDPA_BACKENDS[n] for n in (*names, *(n for n in TORCH_ORDER if n not in names))]


def sdpa_context(names: Sequence[str]) -> Any:
    """A context that tries the backends in `priority(names)` order (none when empty)."""
    return sdpa_kernel(priority(names), set_priority=True) if names else nullcontext()


def sdpa_backend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> str:
    """The backend SDPA picks for [batch, heads, pos, d_head] inputs under the active backend
    settings (GQA enabled), by torch's own selection rule; "none" where no backend fits."""
    try:
        choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, is_causal, enable_gqa=True)
    except RuntimeError:  # every enabled backend refuses the shape
        return "none"
    return BACKEND_NAMES.get(SDPBackend(choice), "none")


_SEEN: dict[tuple[Any, ...], str] = {}


def note_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool
) -> str:
    """Log the backend of a shape not seen before; returns it."""
    key = (tuple(q.shape), tuple(k.shape), q.dtype, q.device.type, mask is not None, causal)
    if key not in _SEEN:
        _SEEN[key] = sdpa_backend(q, k, v, mask, causal)
        kind = "masked" if mask is not None else ("causal" if causal else "full")
        LOG.info(
            "sdpa q %s k %s %s %s on %s -> %s",
            list(q.shape), list(k.shape), str(q.dtype).removeprefix("torch."), kind,
            q.device.type, _SEEN[key],
        )  # fmt: skip
    return _SEEN[key]


def seen_backends() -> dict[str, str]:
    """The backends logged so far, by a readable shape key."""
    return {
        f"q{list(k[0])} k{list(k[1])} {k[2]} {'mask' if k[4] else 'causal' if k[5] else 'full'}": b
        for k, b in _SEEN.items()
    }


# ----- weights cast once per optimizer step ---------------------------------------------------

_GENERATION = [0]  # optimizer steps taken anywhere in this process (a post-step hook)
_HOOKED: list[Any] = []


def _bump(*_: Any) -> None:
    _GENERATION[0] += 1


class _Reuse(torch.autograd.Function):
    """Hands out a cached copy of `sources` (concatenated along `dim`), with the gradient of
    each use split and cast back to each source's dtype, as cat(...).to(...) would send it."""

    @staticmethod
    def forward(ctx: Any, copy: torch.Tensor, dim: int, *sources: torch.Tensor) -> torch.Tensor:
        ctx.dim = dim
        ctx.sizes = [s.shape[dim] for s in sources]
        ctx.dtypes = [s.dtype for s in sources]
        return copy.view_as(copy)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        parts = grad.split(ctx.sizes, ctx.dim) if len(ctx.sizes) > 1 else (grad,)
        return (None, None, *(p.to(t) for p, t in zip(parts, ctx.dtypes)))


def caching(owner: nn.Module) -> bool:
    """Whether `owner` reuses cached weight copies in this pass: switched on, training, with
    gradients, and run eagerly (a compiled graph casts inside itself)."""
    kernels = getattr(owner, "kernels", DEFAULT)
    return (
        kernels.weight_cache
        and owner.training
        and torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
    )


def cached_copy(
    owner: nn.Module, name: str, sources: Sequence[torch.Tensor], dtype: torch.dtype, dim: int
) -> torch.Tensor:
    """`torch.cat(sources, dim).to(dtype)`, computed once per optimizer step (or when a source
    is changed in place or replaced) and kept on `owner`."""
    if not _HOOKED:
        _HOOKED.append(register_optimizer_step_post_hook(_bump))
    key = (_GENERATION[0], dtype, tuple((s.data_ptr(), s._version) for s in sources))
    cache = owner.__dict__.setdefault("_weight_copies", {})
    entry = cache.get(name)
    if entry is None or entry[0] != key:
        with torch.no_grad():
            joined = torch.cat(list(sources), dim) if len(sources) > 1 else sources[0]
            entry = cache[name] = (key, joined.to(dtype))
    return _Reuse.apply(entry[1], dim, *sources)


def joined_weight(
    owner: nn.Module,
    name: str,
    sources: Sequence[torch.Tensor],
    dtype: torch.dtype | None,
    dim: int,
) -> torch.Tensor:
    """The `sources` concatenated along `dim` and cast to `dtype` (None: kept): from the cache
    when `caching(owner)`, else computed here as the default path does."""
    if dtype is not None and dtype != sources[0].dtype and caching(owner):
        return cached_copy(owner, name, sources, dtype, dim)
    joined = torch.cat(list(sources), dim) if len(sources) > 1 else sources[0]
    return joined if dtype is None else joined.to(dtype)
