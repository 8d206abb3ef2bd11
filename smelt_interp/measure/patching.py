"""Activation and attribution patching per (layer, visit), per (layer, visit, head) and per
position, on any looped model with per-visit hook points (model.protocol).

A *node* is one slice of one visit's hook point: a site (the residual stream before, between or
after the sublayers, the attention output, each head's z, the MoE/MLP write, or a head's q, k,
v) at (layer, visit), optionally one head (query heads for z and q; key/value heads for k and v,
which grouped-query heads share) and optionally one position. Every visit's hook fires once per
forward pass, so visit 0 and visit 1 of a looped layer are separate nodes.

- Activation patching (clean -> corrupted, "denoising"): the corrupted prompt runs with the node
  set to its activation on the clean prompt; the score is the metric there, normalised so that
  0 = the corrupted run and 1 = the clean run. Nodes are batched: `batch` patched copies of the
  prompt rows run in one forward pass, each copy editing its own node (a per-copy mask on the
  hook's output), never one forward per node.
- Attribution patching (first order, Nanda 2023; Syed et al. 2023): one clean forward (cached),
  one corrupted forward and one backward of the metric to every hooked activation; a node's
  estimate is sum over its slice of (clean - corrupted) * d metric / d activation, normalised
  like the activation effect. Exact wherever the metric is linear in the node.
- Metrics at each row's scored position (data.patch_pairs.PromptPair): `logit_diff`, the logit
  of the clean answer minus the corrupted answer's, or `loss`, the cross-entropy of the clean
  answer; both averaged over the pair's rows.

Path and cross-visit patching build on these in measure.path_patching."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from smelt_interp.data.patch_pairs import UNKNOWN, PromptPair
from smelt_interp.errors import ProbeError
from smelt_interp.model.protocol import LoopedModel, autocast_for, hook_name

SITES = {
    "resid_pre": "hook_resid_pre",
    "resid_mid": "hook_resid_mid",
    "resid_post": "hook_resid_post",
    "attn_out": "hook_attn_out",
    "z": "attn.hook_z",
    "mlp_out": "hook_mlp_out",
    "q": "attn.hook_q",
    "k": "attn.hook_k",
    "v": "attn.hook_v",
}
HEAD_SITES = ("z", "q", "k", "v")
METRICS = ("logit_diff", "loss")
DEFAULT_COPIES = 16  # patched copies of the pair's rows per forward pass

# A hook's edit over a batch of copies: (mask, value), each broadcastable to the activation
# viewed as [copies, rows, *rest]; where the mask holds, the value replaces the activation.
Edit = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Node:
    """One slice of one visit's hook point (see the module docstring)."""

    layer: int
    visit: int
    site: str
    head: int | None = None
    position: int | None = None

    @property
    def hook(self) -> str:
        return hook_name(self.layer, self.visit, SITES[self.site])

    @property
    def label(self) -> str:
        parts = [f"{self.layer}.{self.visit}", self.site]
        if self.head is not None:
            parts.append(f"h{self.head}")
        if self.position is not None:
            parts.append(f"@{self.position}")
        return " ".join(parts)


def model_device(model: LoopedModel) -> torch.device:
    return next(model.parameters()).device


def n_heads_at(model: LoopedModel, site: str) -> int:
    """Heads a site's hook holds: query heads for z and q, key/value heads for k and v."""
    return model.cfg.n_kv_heads if site in ("k", "v") else model.cfg.n_heads


def check_site(site: str) -> None:
    if site not in SITES:
        raise ProbeError(f"unknown site {site!r}; expected one of {', '.join(SITES)}")


def nodes_of(
    model: LoopedModel,
    site: str,
    *,
    per_head: bool = False,
    per_position: bool = False,
    length: int | None = None,
) -> list[Node]:
    """Every node of `site` in execution order: per visit, then per head (head sites only) and
    per position (`length` positions) when asked."""
    check_site(site)
    if per_head and site not in HEAD_SITES:
        raise ProbeError(f"site {site!r} has no heads; per-head sites: {', '.join(HEAD_SITES)}")
    if per_position and not length:
        raise ProbeError("per-position nodes need the prompt's length")
    heads: list[int | None] = list(range(n_heads_at(model, site))) if per_head else [None]
    positions: list[int | None] = list(range(length or 0)) if per_position else [None]
    return [
        Node(layer, visit, site, head, pos)
        for layer, visit in model.schedule
        for head in heads
        for pos in positions
    ]


def check_nodes(model: LoopedModel, nodes: Sequence[Node], length: int) -> None:
    """Each node names a visit of the schedule, a head and a position that exist."""
    schedule = set(model.schedule)
    for node in nodes:
        check_site(node.site)
        if (node.layer, node.visit) not in schedule:
            raise ProbeError(f"node {node.label}: the model has no visit {node.layer}.{node.visit}")
        if node.head is not None:
            if node.site not in HEAD_SITES:
                raise ProbeError(f"node {node.label}: site {node.site!r} has no heads")
            if not 0 <= node.head < n_heads_at(model, node.site):
                raise ProbeError(f"node {node.label}: head {node.head} is out of range")
        if node.position is not None and not 0 <= node.position < length:
            raise ProbeError(f"node {node.label}: position outside 0..{length - 1}")


def scores(logits: torch.Tensor, pair: PromptPair, metric: str) -> torch.Tensor:
    """The metric [copies] of logits [copies * rows, T, vocab] of copies of the pair's rows,
    averaged over the rows (float64)."""
    n = pair.n_rows
    copies = logits.shape[0] // n
    device = logits.device
    position = pair.position.to(device).repeat(copies)
    at = logits[torch.arange(logits.shape[0], device=device), position].double()
    clean = pair.clean_answer.to(device).repeat(copies)
    if metric == "logit_diff":
        corrupt = pair.corrupt_answer.to(device).repeat(copies)
        value = at.gather(-1, clean[:, None])[:, 0] - at.gather(-1, corrupt[:, None])[:, 0]
    elif metric == "loss":
        value = F.cross_entropy(at, clean, reduction="none")
    else:
        raise ProbeError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    return value.view(copies, n).mean(dim=1)


def run_edited(
    model: LoopedModel,
    tokens: torch.Tensor,
    copies: int,
    edits: Mapping[str, Edit],
    record: Sequence[str] = (),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits of `copies` copies of `tokens` [rows, T] in one forward pass, each hook of `edits`
    edited per copy, and the (edited) activations of the hooks in `record` [copies * rows, ..]."""
    rows = tokens.shape[0]
    recorded: dict[str, torch.Tensor] = {}

    def hook_for(name: str) -> Callable[..., torch.Tensor]:
        def fn(act: torch.Tensor, hook: object = None) -> torch.Tensor:
            if name in edits:
                mask, value = edits[name]
                shaped = act.view(copies, rows, *act.shape[1:])
                act = torch.where(mask, value.to(act.dtype), shaped).view_as(act)
            if name in record:
                recorded[name] = act.detach()
            return act

        return fn

    names = list(dict.fromkeys([*edits, *record]))
    batch = tokens.repeat(copies, 1)
    with torch.no_grad(), autocast_for(model_device(model)):
        logits = model.run_with_hooks(batch, fwd_hooks=[(n, hook_for(n)) for n in names])
    return logits, recorded


def cached(
    model: LoopedModel, tokens: torch.Tensor, names: Sequence[str]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits and the activations of `names` of one unedited forward pass."""
    return run_edited(model, tokens, 1, {}, names)


def prepared(model: LoopedModel, pair: PromptPair) -> PromptPair:
    """The pair checked against the model (ids, length) on its device, cut after its last scored
    position, with any UNKNOWN answer replaced by the model's own prediction
    (_predicted_answers)."""
    device = model_device(model)
    # positions after the last scored one cannot reach it (causal attention): left out
    keep = int(pair.position.max()) + 1
    clean = model.check_tokens(pair.clean[:, :keep]).to(device)
    corrupt = model.check_tokens(pair.corrupt[:, :keep]).to(device)
    pair = PromptPair(
        clean, corrupt, pair.position, pair.clean_answer, pair.corrupt_answer, pair.label
    )
    for name in ("clean_answer", "corrupt_answer"):
        answers = getattr(pair, name)
        if int(answers.min()) < UNKNOWN or int(answers.max()) >= model.cfg.vocab_size:
            raise ProbeError(
                f"the pair's {name} must be token ids in 0..{model.cfg.vocab_size - 1}"
            )
    if bool((pair.clean_answer == UNKNOWN).any()) or bool((pair.corrupt_answer == UNKNOWN).any()):
        pair = _predicted_answers(model, pair)
    return pair


def _predicted_answers(model: LoopedModel, pair: PromptPair) -> PromptPair:
    """UNKNOWN answers filled in: the clean prompt's top token and the corrupted prompt's; where
    both are the same token, the corrupted prompt's best other token (so the logit difference
    says how far the clean prediction leads its strongest rival after the corrupted prompt)."""
    device = model_device(model)
    rows = torch.arange(pair.n_rows, device=device)
    ranked = []
    for tokens in (pair.clean, pair.corrupt):
        logits, _ = cached(model, tokens, ())
        ranked.append(logits[rows, pair.position.to(device)].topk(2, dim=-1).indices.cpu())
    clean = torch.where(pair.clean_answer == UNKNOWN, ranked[0][:, 0], pair.clean_answer)
    top, second = ranked[1][:, 0], ranked[1][:, 1]
    rival = torch.where(top == clean, second, top)
    return pair.with_answers(
        clean, torch.where(pair.corrupt_answer == UNKNOWN, rival, pair.corrupt_answer)
    )


@dataclass(frozen=True)
class Baseline:
    """The metric on the clean and on the corrupted prompt, and the clean activations."""

    clean: float
    corrupt: float
    acts: dict[str, torch.Tensor]

    def normalised(self, values: torch.Tensor | np.ndarray) -> np.ndarray:
        """(value - corrupted) / (clean - corrupted): 0 = corrupted, 1 = clean."""
        gap = self.clean - self.corrupt
        if gap == 0:
            raise ProbeError("the metric is the same on both prompts: nothing to normalise by")
        return (np.asarray(values, dtype=np.float64) - self.corrupt) / gap


def baseline(
    model: LoopedModel, pair: PromptPair, metric: str, names: Sequence[str]
) -> tuple[Baseline, dict[str, torch.Tensor]]:
    """The clean and corrupted runs' metrics, the clean run's activations of `names`, and the
    corrupted run's (the second value)."""
    clean_logits, clean_acts = cached(model, pair.clean, names)
    corrupt_logits, corrupt_acts = cached(model, pair.corrupt, names)
    m_clean = float(scores(clean_logits, pair, metric)[0])
    m_corrupt = float(scores(corrupt_logits, pair, metric)[0])
    return Baseline(m_clean, m_corrupt, clean_acts), corrupt_acts


def node_mask(nodes: Sequence[Node | None], act_shape: torch.Size) -> torch.Tensor:
    """Bool [copies, 1, T, ...] over one hook's activation [rows, T, (heads,) d]: copy i's
    node's slice (None: nothing)."""
    shape = [len(nodes), 1, act_shape[1], *act_shape[2:-1], 1]
    mask = torch.zeros(shape, dtype=torch.bool)
    for i, node in enumerate(nodes):
        if node is None:
            continue
        pos = slice(None) if node.position is None else node.position
        if len(act_shape) == 4:  # [rows, T, heads, d]
            head = slice(None) if node.head is None else node.head
            mask[i, 0, pos, head] = True
        else:
            mask[i, 0, pos] = True
    return mask


def patch_edits(
    nodes: Sequence[Node], sources: Sequence[str], acts: Mapping[str, torch.Tensor]
) -> dict[str, Edit]:
    """Edits for copies of a batch: copy i sets nodes[i] to its activation in `acts` under the
    hook named sources[i] (the node's own hook on another prompt, or another visit's)."""
    edits: dict[str, Edit] = {}
    for name in dict.fromkeys(node.hook for node in nodes):
        mine = [node if node.hook == name else None for node in nodes]
        own = [i for i, node in enumerate(mine) if node is not None]
        ref = acts[sources[own[0]]]
        mask = node_mask(mine, ref.shape).to(ref.device)
        if len({sources[i] for i in own}) == 1:
            value = ref[None]
        else:  # copies read different hooks (cross-visit patching of a layer of 3+ visits)
            value = torch.stack(
                [acts[sources[i]] if m is not None else ref for i, m in enumerate(mine)]
            )
        edits[name] = (mask, value)
    return edits


def _chunks(n: int, size: int) -> list[range]:
    size = max(1, size)
    return [range(lo, min(n, lo + size)) for lo in range(0, n, size)]


def node_records(nodes: Sequence[Node]) -> pd.DataFrame:
    """One row per node: layer, visit, site, head, position (-1 where the node spans all)."""
    return pd.DataFrame(
        {
            "layer": [n.layer for n in nodes],
            "visit": [n.visit for n in nodes],
            "site": [n.site for n in nodes],
            "head": [-1 if n.head is None else n.head for n in nodes],
            "position": [-1 if n.position is None else n.position for n in nodes],
        }
    )


def patched_scores(
    model: LoopedModel,
    pair: PromptPair,
    nodes: Sequence[Node],
    sources: Sequence[str],
    acts: Mapping[str, torch.Tensor],
    *,
    base: torch.Tensor,
    metric: str,
    batch: int = DEFAULT_COPIES,
) -> np.ndarray:
    """The metric [nodes] of `base` rows with each node set, one node per copy, `batch` copies
    per forward pass."""
    out = np.empty(len(nodes))
    for chunk in _chunks(len(nodes), batch):
        part = [nodes[i] for i in chunk]
        edits = patch_edits(part, [sources[i] for i in chunk], acts)
        logits, _ = run_edited(model, base, len(part), edits)
        out[chunk.start : chunk.stop] = scores(logits, pair, metric).cpu().numpy()
    return out


def activation_patching(
    model: LoopedModel,
    pair: PromptPair,
    nodes: Sequence[Node],
    *,
    metric: str = "logit_diff",
    batch: int = DEFAULT_COPIES,
) -> pd.DataFrame:
    """Per node: `metric` of the corrupted prompt with the node patched to its clean value, and
    `effect`, that normalised (0 = corrupted, 1 = clean)."""
    pair = prepared(model, pair)
    check_nodes(model, nodes, pair.length)
    names = list(dict.fromkeys(node.hook for node in nodes))
    base, _ = baseline(model, pair, metric, names)
    values = (
        patched_scores(
            model, pair, nodes, [n.hook for n in nodes], base.acts, base=pair.corrupt, metric=metric
        )
        if nodes
        else np.empty(0)
    )
    frame = node_records(nodes)
    frame["metric"] = values
    frame["effect"] = base.normalised(values)
    frame.attrs.update(clean=base.clean, corrupt=base.corrupt, metric=metric)
    return frame


def _leaf_hook(saved: dict[str, torch.Tensor], name: str) -> Callable[..., torch.Tensor]:
    """A hook that keeps its activation for the backward pass (a leaf that needs a gradient
    where nothing upstream does, e.g. frozen parameters)."""

    def fn(act: torch.Tensor, hook: object = None) -> torch.Tensor:
        # a new tensor either way: a model that uses a hook's output only when the hook
        # replaced it (the transformers adapter) then computes on the one kept here
        act = act.view_as(act) if act.requires_grad else act.detach().requires_grad_(True)
        saved[name] = act
        return act

    return fn


def attribution_patching(
    model: LoopedModel,
    pair: PromptPair,
    nodes: Sequence[Node],
    *,
    metric: str = "logit_diff",
) -> pd.DataFrame:
    """Per node: the first-order estimate of its activation-patching effect, `estimate` (in the
    metric's units) and `effect` (normalised like activation_patching's), from one clean
    forward, one corrupted forward and one backward. NaN for a node the model computes without
    a gradient (torch.no_grad inside its forward, as HRM's one-step-gradient cycles are run):
    no backward pass reaches it, and a 0 there would read as "no effect"."""
    pair = prepared(model, pair)
    check_nodes(model, nodes, pair.length)
    names = list(dict.fromkeys(node.hook for node in nodes))
    clean_logits, clean_acts = cached(model, pair.clean, names)
    saved: dict[str, torch.Tensor] = {}
    with torch.enable_grad(), autocast_for(model_device(model)):
        logits = model.run_with_hooks(
            pair.corrupt, fwd_hooks=[(n, _leaf_hook(saved, n)) for n in names]
        )
        value = scores(logits, pair, metric)[0]
        grads = torch.autograd.grad(value, [saved[n] for n in names], allow_unused=True)
    base = Baseline(float(scores(clean_logits, pair, metric)[0]), float(value.detach()), clean_acts)
    # (clean - corrupted) * gradient, summed over rows and the model dimension: [T, (heads)]
    terms = {}
    for name, grad in zip(names, grads):
        act = saved[name].detach()
        if grad is None:  # computed without a gradient (HRM's cycles before its last): unknown
            terms[name] = torch.full(act.shape[1:-1], torch.nan, dtype=torch.float64)
            continue
        terms[name] = ((clean_acts[name].double() - act.double()) * grad.double()).sum((0, -1))
    estimates = np.array([float(_node_sum(terms[n.hook], n)) for n in nodes])
    frame = node_records(nodes)
    frame["estimate"] = estimates
    frame["effect"] = base.normalised(base.corrupt + estimates)
    frame.attrs.update(clean=base.clean, corrupt=base.corrupt, metric=metric)
    return frame


def _node_sum(term: torch.Tensor, node: Node) -> torch.Tensor:
    """A node's part of a per-(position, head) term [T, (heads)]."""
    if node.position is not None:
        term = term[node.position]
    if node.head is not None:
        term = term[..., node.head]
    return term.sum()


def correlation(activation: pd.DataFrame, attribution: pd.DataFrame) -> dict[str, float]:
    """Pearson and Spearman correlations of two tables' `effect` over the same nodes (in the
    same order) where both are finite, with the count of those nodes; NaN where either column
    is constant."""
    a = activation["effect"].to_numpy(dtype=np.float64)
    b = attribution["effect"].to_numpy(dtype=np.float64)
    if len(a) != len(b):
        raise ProbeError("the two tables hold different nodes")
    finite = np.isfinite(a) & np.isfinite(b)
    a, b = a[finite], b[finite]

    def pearson(x: np.ndarray, y: np.ndarray) -> float:
        if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
            return float("nan")
        return float(np.corrcoef(x, y)[0, 1])

    ranks = [pd.Series(v).rank().to_numpy() for v in (a, b)]
    return {"pearson": pearson(a, b), "spearman": pearson(*ranks), "nodes": float(len(a))}
