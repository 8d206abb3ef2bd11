"""Kernel-friendly matched shapes: a Baseline/SMELT pair whose head widths are multiples of 64 and
whose d_model and d_expert are multiples of 64 or 128, so attention runs flash's 64- or 128-wide
kernel with no padding and the expert GEMMs fill whole tiles.

SMELT's extra visits shrink the KV cache it may hold per visit: a Baseline of 12 layers with 4
K/V heads of 64 leaves SMELT (18 visits) n_kv_heads * d_head = 171 +- 4%, which no multiple of
64 reaches. The search then changes the Baseline's number of K/V heads (a divisor of n_heads,
the nearest GQA layout first: 3 before 6), keeping every other field, so such a Baseline and
today's are two different pairs; the budget command shows both."""

from __future__ import annotations

import math

from smelt_interp.budget.matcher import SearchBudget, match_smelt, smelt_template
from smelt_interp.budget.pairing import Match
from smelt_interp.config import ModelConfig
from smelt_interp.errors import MatchError

KERNEL_HEAD_MULTIPLE = 64  # d_head: flash's 64- and 128-wide kernels, with no padded columns
KERNEL_WIDTH_MULTIPLE = 64  # d_model and d_expert: whole 64-wide GEMM tiles at least
# The d_model and d_expert steps tried, whole 128-wide tiles first.
KERNEL_STEPS = (128, 64)


def misaligned(cfg: ModelConfig) -> list[str]:
    """The fields of `cfg` off the kernel-friendly alignment ("d_head 56"); empty when none."""
    wanted = {
        "d_head": KERNEL_HEAD_MULTIPLE,
        "d_model": KERNEL_WIDTH_MULTIPLE,
        "d_expert": KERNEL_WIDTH_MULTIPLE,
    }
    return [f"{name} {getattr(cfg, name)}" for name, m in wanted.items() if getattr(cfg, name) % m]


def kv_variants(base: ModelConfig) -> list[ModelConfig]:
    """`base`, then the Baselines that differ from it only in n_kv_heads (each divisor of
    n_heads), nearest GQA layout first (by ratio; fewer K/V heads, the smaller cache, on a tie)."""
    counts = [n for n in range(1, base.n_heads + 1) if base.n_heads % n == 0]
    counts.sort(key=lambda n: (abs(math.log(n / base.n_kv_heads)), n))
    return [base.replace(n_kv_heads=n) for n in counts]


def match_kernel_friendly(
    base: ModelConfig,
    *,
    seq_len: int | None = None,
    n_loops: int = 2,
    loop_start: int | None = None,
    loop_end: int | None = None,
    tolerances: dict[str, float] | None = None,
) -> Match:
    """The kernel-friendly pair nearest `base`, within the matcher's tolerances.

    Its SMELT has head widths that are multiples of KERNEL_HEAD_MULTIPLE and d_model and d_expert
    that are multiples of the first of KERNEL_STEPS that matches. Its Baseline is `base` when
    one exists for it, else the nearest of `kv_variants(base)` that has one (compare
    `match.baseline.n_kv_heads` with `base`'s). `base` must itself be aligned (`misaligned`)."""
    # a Baseline no step can help (looped, no span) gets the matcher's own error
    depth = smelt_template(base, n_loops, loop_start, loop_end).effective_depth
    bad = misaligned(base)
    if bad:
        raise MatchError(
            f"the Baseline is not kernel-friendly ({', '.join(bad)}): d_head must be a multiple "
            f"of {KERNEL_HEAD_MULTIPLE}, d_model and d_expert multiples of {KERNEL_WIDTH_MULTIPLE}"
        )
    budget = SearchBudget()  # the whole search's, over every Baseline and step it tries
    for variant in kv_variants(base):
        for step in KERNEL_STEPS:
            if step > variant.d_model:
                continue
            try:
                return match_smelt(
                    variant,
                    seq_len=seq_len,
                    n_loops=n_loops,
                    loop_start=loop_start,
                    loop_end=loop_end,
                    tolerances=tolerances,
                    width_step=step,
                    expert_step=step,
                    d_head_multiple=KERNEL_HEAD_MULTIPLE,
                    budget=budget,
                )
            except MatchError:
                if budget.left < 0:
                    raise  # the search's work is spent: its own message, not the next try
                continue  # no pair at this step or K/V layout: try the next
    per_visit = base.n_layers * base.n_kv_heads * base.d_head / depth
    raise MatchError(
        f"no kernel-friendly pair within tolerance for this Baseline at any n_kv_heads dividing "
        f"n_heads {base.n_heads} (head widths multiples of {KERNEL_HEAD_MULTIPLE}, d_model and "
        f"d_expert of {' or '.join(map(str, KERNEL_STEPS))}); its KV cache leaves SMELT's "
        f"{depth} visits n_kv_heads * d_head = {per_visit:.0f} each"
    )
