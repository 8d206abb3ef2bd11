"""Batching and capture, for every measurement that runs a model: moving a batch to the model's
device with its lengths and validity mask, running the model in micro-batches while caching
only the hook points a measurement needs, and float64 sums pooled over micro-batches."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from smelt_interp.errors import TokenError
from smelt_interp.model.protocol import LoopedModel, autocast_for, hook_name

PROGRESS_DELAY_S = 2.0  # a progress bar appears only for work that outlasts this
DEFAULT_BATCH = 8


@dataclass(frozen=True)
class Batch:
    """Token ids [b, T] on the model's device, valid lengths [b] and the mask [b, T] of valid
    positions (right padding is False). Every row starts with BOS."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    valid: torch.Tensor
    rows: slice = field(default_factory=lambda: slice(None))  # which rows of the full batch

    @property
    def size(self) -> int:
        return self.tokens.shape[0]


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def make_batch(
    model: LoopedModel, tokens: torch.Tensor, lengths: torch.Tensor | Sequence[int] | None = None
) -> Batch:
    """Validate `tokens` (ids, length, BOS first where the model has one) and `lengths`, move
    both to the model's device."""
    tokens = model.check_tokens(tokens)
    b, t = tokens.shape
    if b == 0 or t == 0:
        raise TokenError("empty token batch")
    if lengths is None:
        lengths = torch.full((b,), t, dtype=torch.long)
    lengths = torch.as_tensor(lengths, dtype=torch.long).reshape(-1).cpu()
    if lengths.shape[0] != b:
        raise TokenError(f"lengths has {lengths.shape[0]} entries for {b} rows")
    if int(lengths.min()) < 1 or int(lengths.max()) > t:
        raise TokenError(
            f"lengths must lie in 1..{t}, got {int(lengths.min())}..{int(lengths.max())}"
        )
    first = model.cfg.first_token_id  # None: the tokenizer adds no BOS; position 0 stands in
    if first is not None and bool((tokens[:, 0] != first).any()):
        raise TokenError(f"every row must start with BOS ({first})")
    device = model_device(model)
    tokens, lengths = tokens.to(device), lengths.to(device)
    valid = torch.arange(t, device=device)[None, :] < lengths[:, None]
    return Batch(tokens, lengths, valid)


def micro_batches(batch: Batch, size: int = DEFAULT_BATCH, desc: str = "probe") -> Iterator[Batch]:
    """Slices of `size` rows, each trimmed to its longest row, with a progress bar on stderr
    that shows only when stderr is a terminal and the work outlasts a couple of seconds."""
    starts = range(0, batch.size, max(1, size))
    for lo in tqdm(
        starts,
        desc=desc,
        unit="batch",
        file=sys.stderr,
        delay=PROGRESS_DELAY_S,
        leave=False,
        disable=None,
    ):
        lengths = batch.lengths[lo : lo + size]
        t = int(lengths.max())
        yield Batch(
            batch.tokens[lo : lo + size, :t],
            lengths,
            batch.valid[lo : lo + size, :t],
            slice(lo, lo + size),
        )


def capture(
    model: LoopedModel, tokens: torch.Tensor, names: Iterable[str]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Run the model once, caching exactly the hook points in `names` (never the pattern unless
    asked, so the fused attention path stays on)."""
    wanted = frozenset(names)
    with inference(model):
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in wanted)
    return logits, dict(cache)


@contextlib.contextmanager
def inference(model: torch.nn.Module) -> Iterator[None]:
    """How a probe runs the model: no gradients, under the autocast the model trains with on its
    device (bf16 on CUDA, so the grouped expert kernels run; nothing on the CPU)."""
    with torch.no_grad(), autocast_for(model_device(model)):
        yield


def visit_names(model: LoopedModel, pairs: Iterable[tuple[int, int]], *hooks: str) -> list[str]:
    """hook_name(layer, visit, h) for every pair and hook."""
    return [hook_name(layer, visit, h) for layer, visit in pairs for h in hooks]


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """Sum of `values` where `mask` (broadcastable) is True, over `dims`, in float64."""
    return torch.where(mask, values.double(), 0.0).sum(dim=tuple(dims))


class Accumulator:
    """Running float64 sums (and counts) keyed by anything, for statistics pooled over
    micro-batches: mean = sum / count."""

    def __init__(self) -> None:
        self.sums: dict = {}
        self.counts: dict = {}

    def add(self, key, total: torch.Tensor, count: torch.Tensor | float) -> None:
        total = total.detach().double().cpu()
        count = torch.as_tensor(count, dtype=torch.float64).cpu()
        if key in self.sums:
            self.sums[key] = self.sums[key] + total
            self.counts[key] = self.counts[key] + count
        else:
            self.sums[key], self.counts[key] = total, count

    def mean(self, key) -> torch.Tensor:
        """sum / count; NaN where nothing was counted."""
        return self.sums[key] / self.counts[key]

    def __contains__(self, key) -> bool:
        return key in self.sums
