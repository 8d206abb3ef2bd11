"""Views by execution order: a per-visit cache re-keyed by effective depth, so TransformerLens's
ActivationCache tools (`accumulated_resid`, `decompose_resid`, `stack_head_results`,
`logit_attrs`, `apply_ln_to_stack`) work on a looped model one visit at a time.

The (layer, visit) at position d of `model.schedule` becomes TL's layer d: every per-visit hook
`blocks.{layer}.visits.{v}.REST` is cached as `blocks.{d}.REST`, and `ln_final.hook_scale` (with
the block norms' `ln1`/`ln2` scales where the model exposes them) is computed from the residual,
because TL's attribution tools divide by it. `DepthView` stands in for the HookedTransformer TL
expects: `cfg.n_layers` is the effective depth, `W_U`/`b_U` are the unembedding with the final
norm's gain folded in (TL's `fold_ln` convention: `ln_final` is parameter-free), and
`blocks[d].attn.W_O` with `_result_contribution_scale` (the visit's 1/r) give per-head results.

What a model must expose (SmeltModel is read directly; an adapter adds these):
    schedule                     (layer, visit) pairs in execution order
    cfg                          n_heads, d_head, d_model, vocab_size, max_seq_len (ModelShape)
    final_norm                   the module applied to the last visit's hook_resid_post
    unembed_weight               [vocab, d_model]; optional unembed_bias [vocab]
    readout() -> Readout         instead of the three above, for a norm `norm_spec` cannot read
                                 (Dory's L2 norm, a per-token logit scale, Gemma's 1 + weight)
    head_out(layer, visit)       -> HeadOut, for per-head results and the DLA probe; or
    out_proj(layer)              the linear map whose input is hook_z, for writes with no scale
    pre_norms(layer)             optional (attn_norm, mlp_norm): ln1/ln2 scales per depth
    hook points                  hook_embed (the stream's start) and blocks.{l}.visits.{v}.*
The aliases assume one residual stream threaded through the schedule (hook_embed enters depth
0, each visit's hook_resid_pre is the previous visit's hook_resid_post); `depth_cache` checks
it. The readout must be the model's whole output map: a nonlinear one (a logit softcap, an
attention over block states) cannot be split into parts, and `check_readout` refuses it."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformer_lens import ActivationCache

from smelt_interp.errors import ProbeError
from smelt_interp.model.transformer import SmeltModel

NORMS = ("rms", "layer", "l2")
VISIT_NAME = re.compile(r"blocks\.(\d+)\.visits\.(\d+)\.(.+)")
# What the residual-stream tools read at every visit; hook_z adds the per-head results.
STREAM_HOOKS = (
    "hook_resid_pre",
    "hook_attn_out",
    "hook_resid_mid",
    "hook_mlp_out",
    "hook_resid_post",
)
HEAD_HOOKS = ("attn.hook_z",)


# ----- the readout: final norm and unembedding ----------------------------------------------
@dataclass(frozen=True)
class Readout:
    """The model's output map, linear once the final norm's scale is frozen:
    logits = (centred(x) / scale(x)) @ W_U + b_U, with the norm's gain and bias folded into
    W_U [d_model, vocab] and b_U [vocab]. `norm`: "rms" (scale sqrt(mean x^2 + eps)),
    "layer" (x centred, scale sqrt(var + eps)) or "l2" (scale sqrt(sum x^2 + eps))."""

    norm: str
    eps: float
    W_U: torch.Tensor
    b_U: torch.Tensor

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ProbeError(f"unknown final norm {self.norm!r}; expected one of {NORMS}")

    @property
    def centre(self) -> bool:
        return self.norm == "layer"

    def centred(self, resid: torch.Tensor) -> torch.Tensor:
        return resid - resid.mean(-1, keepdim=True) if self.centre else resid

    def scale(self, resid: torch.Tensor) -> torch.Tensor:
        """The norm's divisor [..., 1] for residuals [..., d_model] (TL's hook_scale)."""
        return norm_scale(self.norm, self.eps, resid)

    def normalized(self, resid: torch.Tensor) -> torch.Tensor:
        """The parameter-free norm (TL's hook_normalized; the gain lives in W_U)."""
        return self.centred(resid) / self.scale(resid)

    def logits(self, resid: torch.Tensor) -> torch.Tensor:
        x = self.normalized(resid)
        return x @ self.W_U.to(x.dtype) + self.b_U.to(x.dtype)

    def directions(
        self, tokens: torch.Tensor, against: int | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(u [..., d_model], bias [...]) with logit(tokens) - logit(against) = x_norm . u +
        bias. `against`: None (the logit itself), a token id (a logit difference) or "mean" (the
        logit minus the mean over the vocabulary, which softmax cannot see)."""
        u, bias = self.W_U[:, tokens].movedim(0, -1), self.b_U[tokens]
        if against == "mean":
            u, bias = u - self.W_U.mean(1), bias - self.b_U.mean()
        elif against is not None:
            u, bias = u - self.W_U[:, int(against)], bias - self.b_U[int(against)]
        if self.centre:  # (x - mean x) . u == x . (u - mean u): the centring moves onto u
            u = u - u.mean(-1, keepdim=True)
        return u, bias


def norm_scale(norm: str, eps: float, resid: torch.Tensor) -> torch.Tensor:
    """The divisor [..., 1] a norm of kind `norm` (NORMS) applies to residuals [..., d_model]."""
    if norm == "layer":
        resid = resid - resid.mean(-1, keepdim=True)
    sq = resid.pow(2)
    total = sq.sum(-1, keepdim=True) if norm == "l2" else sq.mean(-1, keepdim=True)
    return (total + eps).sqrt()


def norm_spec(module: nn.Module) -> tuple[str, float, torch.Tensor | None, torch.Tensor | None]:
    """(norm, eps, gain, bias) of a final or block norm: torch's RMSNorm and LayerNorm, and the
    RMS norms of transformers' models (`variance_epsilon`, an optional `weight`)."""
    if isinstance(module, nn.LayerNorm):
        return "layer", module.eps, module.weight, module.bias
    if isinstance(module, nn.RMSNorm):
        eps = module.eps if module.eps is not None else torch.finfo(torch.float32).eps
        return "rms", eps, module.weight, None
    if hasattr(module, "variance_epsilon"):
        return "rms", float(module.variance_epsilon), getattr(module, "weight", None), None
    raise ProbeError(
        f"cannot read the norm {type(module).__name__}: the model must expose readout() "
        "(smelt_interp.measure.depth_cache.Readout)"
    )


def readout_from(
    final_norm: nn.Module, unembed_weight: torch.Tensor, unembed_bias: torch.Tensor | None = None
) -> Readout:
    """The Readout of a final norm followed by a linear unembedding [vocab, d_model]."""
    norm, eps, gain, bias = norm_spec(final_norm)
    W_U = unembed_weight.detach().T
    b_U = torch.zeros(W_U.shape[1], dtype=W_U.dtype, device=W_U.device)
    if bias is not None:
        b_U = b_U + bias.detach() @ W_U
    if unembed_bias is not None:
        b_U = b_U + unembed_bias.detach()
    if gain is not None:
        W_U = gain.detach()[:, None] * W_U
    return Readout(norm, float(eps), W_U, b_U)


def readout_of(model: Any) -> Readout:
    """The model's Readout: its own `readout()`, else `final_norm` and `unembed_weight`
    (`unembed_bias`), else SmeltModel's ln_final and unembed."""
    if callable(getattr(model, "readout", None)):
        return model.readout()
    if hasattr(model, "final_norm") and hasattr(model, "unembed_weight"):
        bias = getattr(model, "unembed_bias", None)
        return readout_from(model.final_norm, model.unembed_weight, bias)
    if isinstance(model, SmeltModel):
        return readout_from(model.ln_final, model.unembed.weight)
    raise ProbeError(
        f"{type(model).__name__} exposes no readout: give it readout(), or final_norm and "
        "unembed_weight (smelt_interp.measure.depth_cache)"
    )


# ----- per-head writes ---------------------------------------------------------------------
@dataclass(frozen=True)
class HeadOut:
    """How a visit's heads write to the residual: hook_attn_out = scale * (sum_h z_h @ W_O[h]
    + b_O). W_O is [n_heads, d_head, d_model] (TL's layout); `scale` is the visit's 1/r."""

    W_O: torch.Tensor
    b_O: torch.Tensor | None
    scale: float


def head_out(model: Any, layer: int, visit: int) -> HeadOut:
    """The model's own `head_out(layer, visit)`, SmeltModel's W_o and residual scale, or the
    linear `out_proj(layer)` of a model whose writes carry no scale (an adapted model)."""
    if callable(getattr(model, "head_out", None)):
        return model.head_out(layer, visit)
    if callable(getattr(model, "out_proj", None)):
        proj, cfg = model.out_proj(layer), model.cfg
        W_O = proj.weight.detach().T.reshape(cfg.n_heads, cfg.d_head, cfg.d_model)
        bias = None if proj.bias is None else proj.bias.detach()
        return HeadOut(W_O, bias, 1.0)
    if isinstance(model, SmeltModel):
        cfg, block = model.cfg, model.blocks[layer]
        W_O = block.attn.W_o.weight.detach().T.reshape(cfg.n_heads, cfg.d_head, cfg.d_model)
        return HeadOut(W_O, None, float(block.scale))
    raise ProbeError(
        f"{type(model).__name__} exposes no head_out(layer, visit): per-head writes need each "
        "layer's output projection (smelt_interp.measure.depth_cache.HeadOut)"
    )


def pre_norms(model: Any, layer: int) -> tuple[nn.Module, nn.Module] | None:
    """(attention pre-norm, MLP pre-norm) of `layer`, or None where the model exposes none."""
    if callable(getattr(model, "pre_norms", None)):
        return model.pre_norms(layer)
    if isinstance(model, SmeltModel):
        block = model.blocks[layer]
        return block.ln_attn, block.ln_mlp
    return None


# ----- the view TL's ActivationCache reads --------------------------------------------------
@dataclass(frozen=True)
class DepthConfig:
    """The HookedTransformerConfig fields ActivationCache reads, with layers = depths."""

    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_vocab: int
    n_ctx: int
    normalization_type: str  # "RMSPre" or "LNPre": TL's parameter-free norms
    final_rms: bool
    model_name: str = ""
    attn_only: bool = False
    d_mlp: int | None = None  # MoE experts: no single neuron basis to expand
    positional_embedding_type: str = "rotary"


class FreeNorm(nn.Module):
    """TL's ln_final under fold_ln: the final norm without its gain (that is in W_U)."""

    def __init__(self, readout: Readout) -> None:
        super().__init__()
        self.readout = readout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.readout.normalized(x)


@dataclass
class _DepthAttn:
    """blocks[d].attn as TL's head results read it (W_O computed on first use)."""

    load: Callable[[], HeadOut]
    _out: HeadOut | None = None

    @property
    def out(self) -> HeadOut:
        if self._out is None:
            self._out = self.load()
        return self._out

    @property
    def W_O(self) -> torch.Tensor:
        return self.out.W_O

    @property
    def b_O(self) -> torch.Tensor:
        b_O = self.out.b_O
        return torch.zeros(self.W_O.shape[-1], dtype=self.W_O.dtype) if b_O is None else b_O

    @property
    def _result_contribution_scale(self) -> float:
        return self.out.scale


@dataclass
class _DepthBlock:
    layer: int
    visit: int
    attn: _DepthAttn


class DepthView:
    """A looped model seen as a TL model whose layers are its visits in execution order."""

    def __init__(self, model: Any, readout: Readout | None = None) -> None:
        self.model = model
        self.schedule: tuple[tuple[int, int], ...] = tuple(model.schedule)
        self.readout = readout if readout is not None else readout_of(model)
        cfg = model.cfg
        block_norm = pre_norms(model, self.schedule[0][0])
        block_kind = norm_spec(block_norm[0])[0] if block_norm else self.readout.norm
        self.cfg = DepthConfig(
            n_layers=len(self.schedule),
            d_model=cfg.d_model,
            n_heads=cfg.n_heads,
            d_head=cfg.d_head,
            d_vocab=cfg.vocab_size,
            n_ctx=cfg.max_seq_len,
            normalization_type="LNPre" if block_kind == "layer" else "RMSPre",
            final_rms=not self.readout.centre,
            model_name=getattr(cfg, "name", ""),
        )
        self.blocks = [
            _DepthBlock(layer, visit, _DepthAttn(lambda l=layer, v=visit: head_out(model, l, v)))
            for layer, visit in self.schedule
        ]
        self.ln_final = FreeNorm(self.readout)

    @property
    def W_U(self) -> torch.Tensor:
        return self.readout.W_U

    @property
    def b_U(self) -> torch.Tensor:
        return self.readout.b_U

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.W_U.to(x.dtype) + self.b_U.to(x.dtype)

    def label(self, depth: int) -> str:
        """'L{layer}V{visit}' of a depth, for the labels TL's tools return."""
        layer, visit = self.schedule[depth]
        return f"L{layer}V{visit}"

    def tokens_to_residual_directions(self, tokens: torch.Tensor | int) -> torch.Tensor:
        """W_U's column of each token, [..., d_model] (TL's convention)."""
        return self.W_U[:, torch.as_tensor(tokens)].movedim(0, -1)

    def to_single_token(self, text: str) -> int:
        raise ProbeError("a depth view has no tokenizer: give logit_attrs token ids")

    def accumulated_bias(
        self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = False
    ) -> torch.Tensor:
        """Sum of the output biases written before depth `layer` (zero for SmeltModel)."""
        total = torch.zeros(self.cfg.d_model, dtype=self.W_U.dtype, device=self.W_U.device)
        for block in self.blocks[: layer + int(mlp_input)]:
            if block.attn.out.b_O is not None:
                total = total + block.attn.out.b_O * block.attn.out.scale
        return total


# ----- the cache ---------------------------------------------------------------------------
def depth_index(schedule: Iterable[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """(layer, visit) -> effective depth (its position in execution order)."""
    return {(layer, visit): d for d, (layer, visit) in enumerate(schedule)}


def depth_name(name: str, depths: Mapping[tuple[int, int], int]) -> str:
    """`blocks.{layer}.visits.{v}.REST` -> `blocks.{d}.REST`; any other name unchanged."""
    match = VISIT_NAME.fullmatch(name)
    if match is None:
        return name
    layer, visit, rest = int(match[1]), int(match[2]), match[3]
    if (layer, visit) not in depths:
        raise ProbeError(f"{name}: layer {layer} visit {visit} is not in the schedule")
    return f"blocks.{depths[layer, visit]}.{rest}"


def depth_hook_names(model: Any, *, heads: bool = True) -> list[str]:
    """The per-visit hook names to cache for the depth view's tools: the embedding, every
    visit's residual hooks and (with `heads`) hook_z."""
    hooks = STREAM_HOOKS + (HEAD_HOOKS if heads else ())
    names = [f"blocks.{layer}.visits.{visit}.{h}" for layer, visit in model.schedule for h in hooks]
    return ["hook_embed", *names]


def _check_stream(cache: Mapping[str, torch.Tensor], n_depths: int) -> None:
    """One residual stream: the embedding enters depth 0, and each depth's resid_pre is the
    previous depth's resid_post (else decompose_resid would not sum to the residual)."""
    for d in range(n_depths):
        pre = cache.get(f"blocks.{d}.hook_resid_pre")
        before = "hook_embed" if d == 0 else f"blocks.{d - 1}.hook_resid_post"
        post = cache.get(before)
        if pre is not None and post is not None and not torch.allclose(pre, post):
            raise ProbeError(
                f"depth {d}'s hook_resid_pre is not {before}: the model does not thread one "
                "residual stream through its schedule (depth_cache(..., check_stream=False) "
                "keeps the aliases, but decompose_resid will not sum)"
            )


def _norm_scales(model: Any, view: DepthView, cache: dict[str, torch.Tensor]) -> None:
    """Add TL's hook_scale of the final norm and, where the model exposes them, of each depth's
    pre-norms (ln1 before attention, ln2 before the MLP)."""
    last = f"blocks.{view.cfg.n_layers - 1}.hook_resid_post"
    if last in cache:
        resid = cache[last]
        cache["ln_final.hook_scale"] = view.readout.scale(resid)
        cache["ln_final.hook_normalized"] = view.readout.normalized(resid)
    for d, (layer, _) in enumerate(view.schedule):
        norms = pre_norms(model, layer)
        if norms is None:
            continue
        for ln, hook, module in zip(("ln1", "ln2"), ("hook_resid_pre", "hook_resid_mid"), norms):
            resid = cache.get(f"blocks.{d}.{hook}")
            if resid is not None:
                norm, eps, _, _ = norm_spec(module)
                cache[f"blocks.{d}.{ln}.hook_scale"] = norm_scale(norm, eps, resid)


def depth_cache(
    model: Any,
    per_visit: Mapping[str, torch.Tensor],
    readout: Readout | None = None,
    *,
    check_stream: bool = True,
) -> ActivationCache:
    """A TL ActivationCache keyed by effective depth from a per-visit cache (e.g. of
    `model.run_with_cache(tokens, names_filter=depth_hook_names(model).__contains__)`).
    `check_stream`: refuse a model whose visits do not thread one residual stream."""
    view = DepthView(model, readout)
    depths = depth_index(view.schedule)
    cache = {depth_name(name, depths): value for name, value in dict(per_visit).items()}
    if check_stream:
        _check_stream(cache, view.cfg.n_layers)
    _norm_scales(model, view, cache)
    return ActivationCache(cache, view)


def run_with_depth_cache(
    model: Any,
    tokens: torch.Tensor,
    *,
    heads: bool = True,
    names: Sequence[str] = (),
    check_stream: bool = True,
) -> tuple[torch.Tensor, ActivationCache]:
    """Run `model` once (no gradients), caching what the depth view's tools read (and `names`),
    and check that the readout reproduces the model's logits. `check_stream=False` serves a
    model whose visits restart or interpolate their stream (HRM's stacks, Dory): the aliases and
    accumulated_resid hold, decompose_resid does not sum."""
    wanted = frozenset([*depth_hook_names(model, heads=heads), *names])
    with torch.no_grad():
        logits, per_visit = model.run_with_cache(tokens, names_filter=wanted.__contains__)
    cache = depth_cache(model, per_visit, check_stream=check_stream)
    view = cache.model
    check_readout(view.readout, cache[f"blocks.{view.cfg.n_layers - 1}.hook_resid_post"], logits)
    return logits, cache


def check_readout(
    readout: Readout, resid: torch.Tensor, logits: torch.Tensor, positions: int = 64
) -> None:
    """ProbeError unless `readout` maps the final residual [.., d_model] to the model's
    `logits` [.., vocab] (to the precision of their dtype), checked at up to `positions`
    positions spread over the batch (a float64 [positions, vocab] at most): a wrong readout
    would make every attribution wrong."""
    flat_resid, flat_logits = (
        resid.reshape(-1, resid.shape[-1]),
        logits.reshape(-1, logits.shape[-1]),
    )
    rows = torch.linspace(0, flat_resid.shape[0] - 1, min(positions, flat_resid.shape[0]))
    rows = rows.round().long().unique()
    ours = readout.logits(flat_resid[rows.to(resid.device)].double())
    theirs = flat_logits[rows.to(logits.device)].double().to(ours.device)
    low = logits.dtype in (torch.bfloat16, torch.float16)
    tol = (5e-2 if low else 1e-3) * (1.0 + float(theirs.abs().max()))
    err = float((ours - theirs).abs().max())
    if err > tol:
        raise ProbeError(
            f"the readout does not reproduce the model's logits (max |diff| {err:.3g} > "
            f"{tol:.3g}): the model must expose readout() (smelt_interp.measure.depth_cache)"
        )
