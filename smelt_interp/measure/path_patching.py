"""Path patching and cross-visit patching on (layer, visit, head) nodes, and the same activation
patch through nnsight (measure.patching holds the nodes, the metrics and the batched runner).

Path patching, sender -> receiver (clean -> corrupted, like activation patching). The sender is
one head's z at one visit; the receiver is one head's q, k or v input at a later visit (k and v:
the key/value head, which grouped-query heads share). SmeltModel's hook_q/k/v sit after the
projection and RoPE, so the receiver's *input* is patched by recomputing it:

1. the corrupted prompt runs with the sender's z set to its clean value and every other head's
   z, at every visit before the receiver, frozen at its corrupted value (with `freeze_mlp`, the
   MoE/MLP writes too; without, they are recomputed and paths through them count); the
   receiver's q, k or v is recorded: what it reads when only the sender's write has changed;
2. the corrupted prompt runs again with only the receiver's q, k or v set to that recording.

The metric of run 2, normalised (0 = corrupted, 1 = clean), is the effect carried along the
sender's write into that one input of the receiver: a later visit's reading of an earlier
visit's write, apart from every other route. Senders are batched (one copy per sender).

Cross-visit patching: on the clean prompt, one visit of a node is given another visit's
activation of the same node on the same prompt (visit 1 given visit 0's, and the reverse, from
an unedited run), normalised the same way: 1 = nothing lost, 0 = as bad as the corrupted
prompt."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from nnsight import NNsight

from smelt_interp.data.patch_pairs import PromptPair
from smelt_interp.errors import ProbeError
from smelt_interp.measure.patching import (
    DEFAULT_COPIES,
    SITES,
    Edit,
    Node,
    baseline,
    check_nodes,
    check_site,
    model_device,
    n_heads_at,
    node_mask,
    node_records,
    patched_scores,
    prepared,
    run_edited,
    scores,
)
from smelt_interp.model.protocol import LoopedModel, autocast_for, hook_name

RECEIVER_SITES = ("q", "k", "v")


def _check_path(model: LoopedModel, senders: Sequence[Node], receiver: Node) -> None:
    order = {where: i for i, where in enumerate(model.schedule)}
    if receiver.site not in RECEIVER_SITES or receiver.head is None:
        raise ProbeError("the receiver must be one head's q, k or v (site q|k|v with a head)")
    for node in senders:
        if node.site != "z" or node.head is None:
            raise ProbeError(f"sender {node.label}: senders are one head's z (site z, a head)")
        if order[node.layer, node.visit] >= order[receiver.layer, receiver.visit]:
            raise ProbeError(
                f"sender {node.label} does not run before the receiver {receiver.label}"
            )
        if node.position is not None or receiver.position is not None:
            raise ProbeError("path patching spans every position; give nodes without one")


def _sender_edits(
    model: LoopedModel,
    senders: Sequence[Node],
    receiver: Node,
    clean: dict[str, torch.Tensor],
    corrupt: dict[str, torch.Tensor],
    freeze_mlp: bool,
) -> dict[str, Edit]:
    """Run 1's edits: every head's z before the receiver at its corrupted value but each copy's
    sender's, at its clean value (and the MLP writes frozen, if asked)."""
    edits: dict[str, Edit] = {}
    everything = torch.ones(1, dtype=torch.bool, device=model_device(model))
    for layer, visit in model.schedule:
        if (layer, visit) == (receiver.layer, receiver.visit):
            break
        name = hook_name(layer, visit, SITES["z"])
        mine = [node if node.hook == name else None for node in senders]
        if any(node is not None for node in mine):
            pick = node_mask(mine, clean[name].shape).to(everything.device)
            edits[name] = (everything, torch.where(pick, clean[name][None], corrupt[name][None]))
        else:
            edits[name] = (everything, corrupt[name][None])
        if freeze_mlp:
            mlp = hook_name(layer, visit, SITES["mlp_out"])
            edits[mlp] = (everything, corrupt[mlp][None])
    return edits


def path_patching(
    model: LoopedModel,
    pair: PromptPair,
    senders: Sequence[Node],
    receiver: Node,
    *,
    metric: str = "logit_diff",
    freeze_mlp: bool = False,
    batch: int = DEFAULT_COPIES,
) -> pd.DataFrame:
    """Per sender: `metric` and its normalised `effect` of the path sender -> receiver's input
    (the module docstring's two runs), the receiver named in the table's columns."""
    pair = prepared(model, pair)
    check_nodes(model, [*senders, receiver], pair.length)
    _check_path(model, senders, receiver)
    before = model.schedule[: list(model.schedule).index((receiver.layer, receiver.visit))]
    names = [hook_name(layer, visit, SITES["z"]) for layer, visit in before]
    if freeze_mlp:
        names += [hook_name(layer, visit, SITES["mlp_out"]) for layer, visit in before]
    base, corrupt_acts = baseline(model, pair, metric, names)
    values = np.empty(len(senders))
    for lo in range(0, len(senders), max(1, batch)):
        part = senders[lo : lo + batch]
        edits = _sender_edits(model, part, receiver, base.acts, corrupt_acts, freeze_mlp)
        _, recorded = run_edited(model, pair.corrupt, len(part), edits, [receiver.hook])
        read = recorded[receiver.hook]
        value = read.view(len(part), pair.n_rows, *read.shape[1:])
        mask = node_mask([receiver], read.shape).to(read.device)
        logits, _ = run_edited(model, pair.corrupt, len(part), {receiver.hook: (mask, value)})
        values[lo : lo + len(part)] = scores(logits, pair, metric).cpu().numpy()
    frame = node_records(senders)
    frame["receiver"] = receiver.label
    frame["metric"] = values
    frame["effect"] = base.normalised(values)
    frame.attrs.update(clean=base.clean, corrupt=base.corrupt, metric=metric)
    return frame


def cross_visit_nodes(
    model: LoopedModel, site: str, per_head: bool = False
) -> list[tuple[Node, str]]:
    """(target node, source hook) for every looped layer, every ordered pair of its visits and
    (per_head) every head: the target visit's node given the source visit's activation."""
    check_site(site)
    heads: list[int | None] = list(range(n_heads_at(model, site))) if per_head else [None]
    out = []
    for layer in model.cfg.looped_layers:
        visits = range(model.cfg.visits_of(layer))
        for dst in visits:
            for src in visits:
                if src == dst:
                    continue
                for head in heads:
                    out.append((Node(layer, dst, site, head), hook_name(layer, src, SITES[site])))
    return out


def cross_visit_patching(
    model: LoopedModel,
    pair: PromptPair,
    site: str = "z",
    *,
    per_head: bool = True,
    metric: str = "logit_diff",
    batch: int = DEFAULT_COPIES,
) -> pd.DataFrame:
    """Per looped layer, ordered pair of visits (`source_visit` -> `visit`) and head: the clean
    prompt's `metric` with that visit's `site` set to the source visit's, and `effect`,
    normalised by the pair (1 = the clean run, 0 = the corrupted one)."""
    pair = prepared(model, pair)
    if not model.cfg.is_looped:
        raise ProbeError("cross-visit patching needs a looped model (a layer run twice)")
    targets = cross_visit_nodes(model, site, per_head)
    nodes = [node for node, _ in targets]
    sources = [source for _, source in targets]
    base, _ = baseline(
        model, pair, metric, list(dict.fromkeys([*sources, *(n.hook for n in nodes)]))
    )
    values = patched_scores(
        model, pair, nodes, sources, base.acts, base=pair.clean, metric=metric, batch=batch
    )
    frame = node_records(nodes)
    frame.insert(2, "source_visit", [int(s.split(".")[3]) for s in sources])
    frame["metric"] = values
    frame["effect"] = base.normalised(values)
    frame.attrs.update(clean=base.clean, corrupt=base.corrupt, metric=metric)
    return frame


def _envoy(nm: Any, name: str) -> Any:
    """nnsight's handle on a hook point by its dotted name (numbers index module lists)."""
    node = nm
    for part in name.split("."):
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    return node


def nnsight_patched_logits(
    model: LoopedModel, tokens: torch.Tensor, node: Node, value: torch.Tensor
) -> torch.Tensor:
    """Logits of `tokens` with `node` set to `value` (the full activation of its hook; only the
    node's slice is taken) through nnsight: the same edit as activation_patching's, by the other
    library the project supports."""
    mask = node_mask([node], value.shape)[0].to(value.device)
    nm = NNsight(model)
    with torch.no_grad(), autocast_for(model_device(model)):
        with nm.trace(tokens):
            point = _envoy(nm, node.hook)
            point.output = torch.where(mask, value.to(point.output.dtype), point.output)
            logits = nm.output.save()
    return logits
