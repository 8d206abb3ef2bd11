"""Causal interventions through nnsight (`NNsight(model).trace(tokens)`), each returning the
edited run's logits, loss and (given Dyck answer spans) answer accuracy, so a notebook can
measure what an edit costs:

- run_without_bos_attention: one visit's attention to BOS removed (key-0 column set to 0 and
  rows renormalised; query 0, which sees only BOS, is left as is), on the explicit path;
- patch_visit: one visit's activation at a hook replaced by another visit's (an earlier visit
  of the same layer in the same forward pass), e.g. the second pass's output by the first's;
- mean_ablate_head: one head's `hook_z` at one visit replaced by a fixed mean vector.

Each visit owns its hook modules, so the edit addresses `nm.blocks[l].visits[v]...` directly.
nnsight reads the trace body from source: call these from files or notebooks, not stdin; `-v`
on the command line turns on nnsight's debug mode (full tracebacks)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from nnsight import NNsight

from smelt_interp.errors import ProbeError
from smelt_interp.measure.attention_stats import without_bos
from smelt_interp.measure.batching import Batch, inference, make_batch
from smelt_interp.measure.dyck_score import Span, answer_scores
from smelt_interp.model.protocol import VISIT_HOOKS
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes.common import check_visit
from smelt_interp.probes.metrics import ce_totals


@dataclass
class InterventionResult:
    """Logits [b, T, vocab] of the (edited) run; loss: mean next-token CE over valid positions;
    answer_token_acc / answer_exact: teacher-forced Dyck accuracy when spans were given."""

    logits: torch.Tensor
    loss: float
    answer_token_acc: float | None = None
    answer_exact: float | None = None


def _result(
    logits: torch.Tensor, batch: Batch, answer_spans: Sequence[Span] | None
) -> InterventionResult:
    logits = logits.detach()
    total, count = ce_totals(logits, batch.tokens, batch.valid)
    out = InterventionResult(logits, float(total / count))
    if answer_spans is not None:
        right, exact = answer_scores(logits, batch.tokens, answer_spans)
        out.answer_token_acc = float(right.sum()) / sum(e - s for s, e in answer_spans)
        out.answer_exact = float(exact.double().mean())
    return out


def _envoy(nm: Any, layer: int, visit: int, hook: str) -> Any:
    """nnsight's handle on blocks.{layer}.visits.{visit}.{hook}."""
    node = nm.blocks[layer].visits[visit]
    for part in hook.split("."):
        node = getattr(node, part)
    return node


def clean_run(
    model: SmeltModel,
    tokens: torch.Tensor,
    lengths: Sequence[int] | torch.Tensor | None = None,
    *,
    answer_spans: Sequence[Span] | None = None,
) -> InterventionResult:
    """The unedited run, measured the same way (the reference an edit is compared with)."""
    batch = make_batch(model, tokens, lengths)
    with inference(model):
        return _result(model(batch.tokens), batch, answer_spans)


def run_without_bos_attention(
    model: SmeltModel,
    tokens: torch.Tensor,
    layer: int,
    visit: int = 1,
    lengths: Sequence[int] | torch.Tensor | None = None,
    *,
    answer_spans: Sequence[Span] | None = None,
) -> InterventionResult:
    """Run with (layer, visit)'s attention to BOS removed."""
    batch = make_batch(model, tokens, lengths)
    check_visit(model, layer, visit)
    nm = NNsight(model)
    with inference(model), model.explicit_attention([(layer, visit)]):
        with nm.trace(batch.tokens):
            point = _envoy(nm, layer, visit, "attn.hook_pattern")
            point.output = without_bos(point.output)
            logits = nm.output.save()
    return _result(logits, batch, answer_spans)


def patch_visit(
    model: SmeltModel,
    tokens: torch.Tensor,
    layer: int,
    src_visit: int = 0,
    dst_visit: int = 1,
    hook: str = "hook_resid_post",
    lengths: Sequence[int] | torch.Tensor | None = None,
    *,
    answer_spans: Sequence[Span] | None = None,
) -> InterventionResult:
    """Run with visit `dst_visit`'s `hook` activation replaced by visit `src_visit`'s, same
    layer, same forward pass (src must run first). hook: any per-visit hook, e.g.
    'hook_resid_post', 'hook_attn_out', 'attn.hook_v', 'attn.hook_pattern'."""
    if hook not in VISIT_HOOKS:
        raise ProbeError(f"unknown hook {hook!r}; expected one of {', '.join(VISIT_HOOKS)}")
    batch = make_batch(model, tokens, lengths)
    check_visit(model, layer, src_visit)
    check_visit(model, layer, dst_visit)
    if src_visit >= dst_visit:
        raise ProbeError(
            f"patch_visit copies an earlier visit into a later one; got src_visit={src_visit}, "
            f"dst_visit={dst_visit}"
        )
    explicit = [(layer, src_visit), (layer, dst_visit)] if hook == "attn.hook_pattern" else []
    nm = NNsight(model)
    with inference(model), model.explicit_attention(explicit):
        with nm.trace(batch.tokens):
            source = _envoy(nm, layer, src_visit, hook).output
            _envoy(nm, layer, dst_visit, hook).output = source
            logits = nm.output.save()
    return _result(logits, batch, answer_spans)


def mean_ablate_head(
    model: SmeltModel,
    tokens: torch.Tensor,
    layer: int,
    visit: int,
    head: int,
    mean: torch.Tensor,
    lengths: Sequence[int] | torch.Tensor | None = None,
) -> InterventionResult:
    """Run with one head's output at (layer, visit), its `attn.hook_z` slice [b, T, d_head],
    replaced at every position by `mean` [d_head] (a mean ablation: the head's average output
    stays, what it reads from each row goes)."""
    return mean_ablate_heads(model, tokens, [(layer, visit, head, mean)], lengths)


def mean_ablate_heads(
    model: SmeltModel,
    tokens: torch.Tensor,
    heads: Sequence[tuple[int, int, int, torch.Tensor]],
    lengths: Sequence[int] | torch.Tensor | None = None,
) -> InterventionResult:
    """mean_ablate_head of several (layer, visit, head, mean) at once, in one run."""
    batch = make_batch(model, tokens, lengths)
    for layer, visit, head, mean in heads:
        check_visit(model, layer, visit)
        if not 0 <= head < model.cfg.n_heads:
            raise ProbeError(
                f"head {head} is out of range; the model has {model.cfg.n_heads} heads"
            )
        if tuple(mean.shape) != (model.cfg.d_head,):
            raise ProbeError(
                f"the mean must be [d_head={model.cfg.d_head}], got {tuple(mean.shape)}"
            )
    order = {where: i for i, where in enumerate(model.schedule)}
    by_visit: dict[tuple[int, int], list[tuple[int, torch.Tensor]]] = {}
    for layer, visit, head, mean in heads:
        by_visit.setdefault((layer, visit), []).append((head, mean))
    nm = NNsight(model)
    with inference(model):
        with nm.trace(batch.tokens):
            # nnsight edits modules in the order the forward pass reaches them
            for layer, visit in sorted(by_visit, key=order.__getitem__):
                point = _envoy(nm, layer, visit, "attn.hook_z")
                for head, mean in by_visit[layer, visit]:
                    point.output[:, :, head] = mean.to(batch.tokens.device)
            logits = nm.output.save()
    return _result(logits, batch, None)
