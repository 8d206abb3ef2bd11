"""The SMELT/Baseline matcher: a search over hidden size, head layout, expert width and expert
count for the SMELT config of a Baseline's physical depth whose three budgets match its own."""

from __future__ import annotations

import math

from smelt_interp.budget.counting import Budget
from smelt_interp.budget.pairing import TOLERANCES, Match, mismatch_table
from smelt_interp.config import ModelConfig
from smelt_interp.errors import MatchError
from smelt_interp.fields import check_int

# Most (width, d_head, n_kv_heads) layouts the matcher tries: about ten seconds on one CPU core.
MAX_SEARCH = 10_000_000
# Head-width alignments the matcher takes: 2 (any even width, the CPU default), 8 (what cuDNN
# and memory-efficient attention need on sm90), 16 (whole bf16 tensor-core tiles) and 64 (flash's
# 64- and 128-wide kernels with no padding: the kernel-friendly shapes, budget.kernel).
D_HEAD_MULTIPLES = (2, 8, 16, 64)
# The largest width or expert step the matcher takes: a step wider than any model's d_model.
MAX_STEP = 1 << 16


# What one SMELT shape costs the search (its expert options built and scored), in the units of
# one layout tried: the search's work, not only its layouts, is held under MAX_SEARCH.
SHAPE_COST = 40


class SearchBudget:
    """The work a search may still do, in layouts tried (about a microsecond each): shared by
    every match a search makes (the kernel-friendly one tries many Baselines and steps), so the
    whole search, not each of its parts, stays within MAX_SEARCH, about ten seconds."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = MAX_SEARCH if limit is None else limit
        self.left = self.limit

    def spend(self, work: int) -> None:
        self.left -= work
        if self.left < 0:
            raise MatchError(
                f"the search for a matched SMELT config passed {self.limit:,} layouts tried "
                f"without finishing; a larger width_step or a smaller Baseline narrows it"
            )


def _candidate_heads(
    d_model: int,
    base: ModelConfig,
    kv_target: float,
    depth: int,
    kv_tol: float,
    multiple: int,
    budget: SearchBudget,
) -> list[tuple[int, int, int]]:
    """(n_heads, d_head, n_kv_heads) whose KV cache is within tolerance of the target and
    whose attention width n_heads * d_head stays within 25% of d_model."""
    out = []
    for d_head in _head_widths(base, multiple):
        budget.spend(2 * base.n_kv_heads)
        for n_kv in range(1, 2 * base.n_kv_heads + 1):
            if abs(depth * 4 * n_kv * d_head / kv_target - 1.0) > kv_tol:
                continue
            budget.spend(4 * d_model // d_head // n_kv + 1)
            for n_heads in range(n_kv, 4 * d_model // d_head + 1, n_kv):
                if 0.75 * d_model <= n_heads * d_head <= 1.25 * d_model:
                    out.append((n_heads, d_head, n_kv))
    return out


def _head_widths(base: ModelConfig, multiple: int = 2) -> range:
    """The d_head values the matcher tries: half to twice the Baseline's, multiples of
    `multiple` (even by default)."""
    low = max(8, base.d_head // 2)
    return range(-(-low // multiple) * multiple, 2 * base.d_head + 1, multiple)


def smelt_template(
    base: ModelConfig, n_loops: int = 2, loop_start: int | None = None, loop_end: int | None = None
) -> ModelConfig:
    """`base` looped as SMELT loops it (span L/4 .. 3L/4 unless given), before any reshaping; a
    MatchError when `base` is looped already or has no span to repeat."""
    if base.is_looped:
        raise MatchError("the matcher takes an unlooped Baseline config (n_loops = 1)")
    L = base.n_layers
    start = L // 4 if loop_start is None else loop_start
    end = (3 * L) // 4 if loop_end is None else loop_end
    if L < 2 or end <= start:
        raise MatchError(
            f"a Baseline of {L} layer(s) has no loop span to repeat "
            f"(span {start}..{end}); SMELT needs at least 2 layers"
        )
    return ModelConfig.smelt(
        **{
            **base.to_dict(),
            "loop_start": start,
            "loop_end": end,
            "n_loops": n_loops,
            "name": "smelt",
        }
    )


def _check_search(base: ModelConfig, step: int, d_head_multiple: int) -> None:
    """MatchError where the head layouts to try for `base` at width step `step` pass MAX_SEARCH."""
    search = (
        len(range(step, base.d_model + 1, step))
        * len(_head_widths(base, d_head_multiple))
        * 2
        * base.n_kv_heads
    )
    if search > MAX_SEARCH:
        raise MatchError(
            f"matching this Baseline would try {search:,} head layouts (d_model "
            f"{base.d_model}, d_head {base.d_head}, n_kv_heads {base.n_kv_heads}), more than "
            f"{MAX_SEARCH:,}; a larger width_step or a smaller Baseline narrows the search"
        )


def _unnaturalness(
    base: ModelConfig, d_model: int, n_heads: int, d_head: int, n_kv: int, shape: dict
) -> float:
    """How far a candidate's shapes stray from the Baseline's proportions (0: the same)."""
    return (
        abs(math.log((shape["d_expert"] / d_model) / (base.d_expert / base.d_model)))
        + abs(math.log(n_heads * d_head / d_model))
        + 0.5 * abs(math.log(n_heads / base.n_heads))
        + 0.5 * abs(math.log(d_head / base.d_head))
        + 0.25 * abs(math.log((n_heads / n_kv) / base.n_group))
    )


def _best_shape(
    base: ModelConfig,
    template: ModelConfig,
    target: Budget,
    seq_len: int,
    step: int,
    tol: dict[str, float],
    d_head_multiple: int,
    expert_step: int,
    budget: SearchBudget,
) -> tuple[float, dict[str, int]] | None:
    """(score, SMELT's shape fields) of the best-scoring candidate, or None when none fits:
    the worst mismatch relative to its tolerance, ties within 80% broken by naturalness."""
    best: tuple[float, dict[str, int]] | None = None
    for d_model in range(step, base.d_model + 1, step):
        if d_model < 0.3 * base.d_model:
            continue
        heads = _candidate_heads(
            d_model, base, target.kv, template.effective_depth, tol["kv"], d_head_multiple, budget
        )
        budget.spend(SHAPE_COST * len(heads))
        for n_heads, d_head, n_kv in heads:
            for shape in _expert_options(
                template, target, seq_len, d_model, n_heads, d_head, n_kv, expert_step
            ):
                worst = max(abs(shape[q] / getattr(target, q) - 1.0) / tol[q] for q in tol)
                natural = _unnaturalness(base, d_model, n_heads, d_head, n_kv, shape)
                # within 80% of every tolerance all candidates tie: prefer natural shapes
                score = max(worst, 0.8) + 0.1 * natural
                if best is None or score < best[0]:
                    best = (
                        score,
                        {
                            "d_model": d_model,
                            "n_heads": n_heads,
                            "d_head": d_head,
                            "n_kv_heads": n_kv,
                            "d_expert": shape["d_expert"],
                            "n_experts": shape["n_experts"],
                        },
                    )
    return best


def match_smelt(
    base: ModelConfig,
    *,
    seq_len: int | None = None,
    n_loops: int = 2,
    loop_start: int | None = None,
    loop_end: int | None = None,
    tolerances: dict[str, float] | None = None,
    width_step: int | None = None,
    expert_step: int = 8,
    d_head_multiple: int = 2,
    budget: SearchBudget | None = None,
) -> Match:
    """SMELT config matching `base` on FLOPs, KV and parameters at the same physical depth.

    Searches hidden size (narrower, to pay for the extra visits), head layout (to recover the
    cache), expert width (solved from the FLOP target) and expert count (solved from the
    parameter target), scoring by the worst mismatch relative to its tolerance and, among
    equals, by how close the shapes stay to the Baseline's.

    `d_head_multiple` restricts the head width to multiples of it: 8 for the GPU's fused
    attention kernels (cuDNN and memory-efficient attention need d_head % 8 == 0, and flash
    pads any other width to the next of 32, 64, 96, ...; see D_HEAD_MULTIPLES).

    `width_step` and `expert_step` are the steps of SMELT's d_model (None: 16 from a Baseline
    d_model of 128, else 8) and d_expert: multiples of 64 or 128 keep the GEMMs on whole tiles.
    `budget`: the work left to a search this match is part of (default: its own MAX_SEARCH)."""
    if width_step is not None:
        check_int("width_step", width_step, 1, MAX_STEP, error=MatchError)
    check_int("expert_step", expert_step, 1, MAX_STEP, error=MatchError)
    if d_head_multiple not in D_HEAD_MULTIPLES:
        raise MatchError(
            f"d_head_multiple must be one of {', '.join(map(str, D_HEAD_MULTIPLES))}, "
            f"got {d_head_multiple!r}"
        )
    tol = {**TOLERANCES, **(tolerances or {})}
    seq_len = base.max_seq_len if seq_len is None else seq_len
    template = smelt_template(base, n_loops, loop_start, loop_end)
    target = Budget.of(base, seq_len)
    step = width_step or (16 if base.d_model >= 128 else 8)
    _check_search(base, step, d_head_multiple)
    best = _best_shape(
        base,
        template,
        target,
        seq_len,
        step,
        tol,
        d_head_multiple,
        expert_step,
        budget or SearchBudget(),
    )
    if best is None:
        raise MatchError(f"no SMELT shape fits under Baseline d_model={base.d_model}")
    smelt = template.replace(**best[1])
    table = mismatch_table(base, smelt, seq_len, tol)
    if not table["within"].all():
        bad = ", ".join(
            f"{q} {table.loc[q, 'mismatch']:+.1%} (tolerance {tol[q]:.0%})"
            for q in table.index
            if not table.loc[q, "within"]
        )
        raise MatchError(
            f"cannot match this Baseline within tolerance: the closest SMELT config misses on {bad}"
        )
    return Match(base, smelt, table, seq_len)


def _expert_options(
    template: ModelConfig,
    target: Budget,
    seq_len: int,
    d_model: int,
    n_heads: int,
    d_head: int,
    n_kv: int,
    expert_step: int,
) -> list[dict[str, float]]:
    """Expert shapes near the FLOP target (d_expert) and parameter target (n_experts), with
    their params / flops / kv computed by the same formulas as counting.py."""
    depth, L, k = template.effective_depth, template.n_layers, template.top_k
    attn = 2 * d_model * d_head * (n_heads + n_kv)
    attention = 4 * n_heads * d_head * seq_len
    kv = depth * 2 * n_kv * d_head * 2
    solved = (target.flops / depth - attention) / 2 - attn - d_model * template.n_experts
    centre = int(round(solved / (3 * k * d_model) / expert_step))
    options = []
    for steps in range(centre - 3, centre + 4):
        d_expert = steps * expert_step
        if d_expert < expert_step:
            continue
        per_expert = 3 * d_model * d_expert + d_model
        fixed = L * (attn + 2 * d_model) + d_model
        exact = (target.params - fixed) / (L * per_expert)
        for n_experts in {math.floor(exact), math.ceil(exact)}:
            if n_experts < max(k, 1):
                continue
            params = fixed + L * n_experts * per_expert
            flops = depth * (
                2.0 * (attn + d_model * n_experts + k * 3 * d_model * d_expert) + attention
            )
            options.append(
                {
                    "d_expert": d_expert,
                    "n_experts": n_experts,
                    "params": params,
                    "flops": flops,
                    "kv": kv,
                }
            )
    return options
