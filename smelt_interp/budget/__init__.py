"""Budget accounting (paper section 3.2) and the SMELT/Baseline matcher.

Counts, for any config: non-embedding parameters, forward FLOPs per token at a sequence length
(2 x active matmul parameters per executed layer plus attention scores and values over the full
context, so a looped layer counts once per visit), KV-cache bytes per token (one entry per
visit), and the compute-equivalent sparsity S = 1 - F_active / F_dense, where F_dense is the
per-token FLOPs of a fully dense control with the same non-embedding parameters, each used once
(2 x non-embedding parameters plus attention once per physical layer). `match_smelt` takes a
Baseline and returns a SMELT config of the same physical depth whose three budgets match; a
matched pair shares one S, its Baseline's (`Match.sparsity`, `pair_sparsity`), as in the paper's
grid.

`python -m smelt_interp.budget` prints the matched pair for a Baseline shape (see __main__.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from smelt_interp.config import ModelConfig
from smelt_interp.errors import ConfigError, MatchError

TOLERANCES = {"params": 0.01, "flops": 0.04, "kv": 0.04}
# Most (width, d_head, n_kv_heads) layouts the matcher tries: about ten seconds on one CPU core.
MAX_SEARCH = 10_000_000


# ----- counting --------------------------------------------------------------------------
def _attn_proj_params(cfg: ModelConfig) -> int:
    return 2 * cfg.d_model * cfg.d_head * (cfg.n_heads + cfg.n_kv_heads)


def param_breakdown(cfg: ModelConfig) -> dict[str, int]:
    """Parameters by part; `non_embedding` sums attention, experts, routers and norms."""
    L, d = cfg.n_layers, cfg.d_model
    parts = {
        "attention": L * _attn_proj_params(cfg),
        "experts": L * cfg.n_experts * 3 * d * cfg.d_expert,
        "routers": L * d * cfg.n_experts,
        "norms": (2 * L + 1) * d,
    }
    parts["non_embedding"] = sum(parts.values())
    parts["embedding"] = 2 * cfg.vocab_size * d  # input embedding + untied unembedding
    return parts


def non_embedding_params(cfg: ModelConfig) -> int:
    return param_breakdown(cfg)["non_embedding"]


def _attention_flops(cfg: ModelConfig, seq_len: int) -> int:
    """Scores (QK^T) and values (PV) of one executed layer for one token at context seq_len."""
    return 2 * 2 * cfg.n_heads * cfg.d_head * seq_len


def layer_flops_per_token(
    cfg: ModelConfig, seq_len: int, experts_active: int | None = None
) -> float:
    """Forward FLOPs of one executed layer for one token at context `seq_len`."""
    k = cfg.top_k if experts_active is None else experts_active
    matmul_params = (
        _attn_proj_params(cfg) + cfg.d_model * cfg.n_experts + k * 3 * cfg.d_model * cfg.d_expert
    )
    return 2.0 * matmul_params + _attention_flops(cfg, seq_len)


def flops_per_token(
    cfg: ModelConfig,
    seq_len: int | None = None,
    *,
    all_experts: bool = False,
    include_unembedding: bool = False,
) -> float:
    """Forward FLOPs per token (F_active), one count per executed layer; `all_experts` counts
    every expert as active (an upper bound, not the dense control: see dense_flops_per_token)."""
    seq_len = _check_seq_len(cfg, seq_len)
    active = cfg.n_experts if all_experts else cfg.top_k
    total = cfg.effective_depth * layer_flops_per_token(cfg, seq_len, active)
    if include_unembedding:
        total += 2.0 * cfg.d_model * cfg.vocab_size
    return total


def dense_flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> float:
    """F_dense: per-token forward FLOPs of a fully dense control with the same non-embedding
    parameters, each used once per token (2 x non-embedding parameters), plus attention scores
    and values once per physical layer. A looped layer's extra visits are not counted here: the
    control runs its parameters once, so looping raises F_active, not F_dense."""
    seq_len = _check_seq_len(cfg, seq_len)
    return 2.0 * non_embedding_params(cfg) + cfg.n_layers * _attention_flops(cfg, seq_len)


def _check_seq_len(cfg: ModelConfig, seq_len: int | None) -> int:
    seq_len = cfg.max_seq_len if seq_len is None else seq_len
    if seq_len < 1:
        raise ConfigError(f"seq_len must be positive, got {seq_len}")
    return seq_len


def kv_bytes_per_token(cfg: ModelConfig, bytes_per_element: int = 2) -> int:
    """KV-cache bytes one token occupies: K and V for every executed (layer, visit)."""
    return cfg.effective_depth * 2 * cfg.n_kv_heads * cfg.d_head * bytes_per_element


def sparsity(cfg: ModelConfig, seq_len: int | None = None) -> float:
    """Compute-equivalent sparsity of one config, S = 1 - F_active / F_dense (F_dense from
    dense_flops_per_token). For a matched pair use `pair_sparsity`: the pair shares one S."""
    return 1.0 - flops_per_token(cfg, seq_len) / dense_flops_per_token(cfg, seq_len)


@dataclass(frozen=True)
class Budget:
    """The three matched quantities plus sparsity, for one config at one length."""

    params: int
    flops: float
    kv: int
    sparsity: float
    seq_len: int

    @classmethod
    def of(cls, cfg: ModelConfig, seq_len: int | None = None) -> Budget:
        seq_len = cfg.max_seq_len if seq_len is None else seq_len
        return cls(
            non_embedding_params(cfg),
            flops_per_token(cfg, seq_len),
            kv_bytes_per_token(cfg),
            sparsity(cfg, seq_len),
            seq_len,
        )


def budget_table(
    configs: dict[str, ModelConfig],
    seq_len: int | None = None,
    pair: tuple[str, str] | None = None,
) -> pd.DataFrame:
    """One row per model: parameters, FLOPs/token, KV bytes/token, sparsity, depth.

    `pair` names a (Baseline, SMELT) in `configs`: when they are matched within tolerance both
    rows carry the pair's one S (pair_sparsity), and column `shared_S` says so."""
    shared = None
    if pair is not None:
        base = configs[pair[0]]
        shared = pair_sparsity(base, configs[pair[1]], seq_len or base.max_seq_len)
    rows = []
    for name, cfg in configs.items():
        b = Budget.of(cfg, seq_len)
        in_pair = shared is not None and name in pair
        rows.append(
            {
                "model": name,
                "non_embedding_params": b.params,
                "flops_per_token": b.flops,
                "kv_bytes_per_token": b.kv,
                "sparsity": shared if in_pair else b.sparsity,
                "shared_S": in_pair,
                "effective_depth": cfg.effective_depth,
                "seq_len": b.seq_len,
            }
        )
    return pd.DataFrame(rows).set_index("model")


# ----- matching --------------------------------------------------------------------------
@dataclass(frozen=True)
class Match:
    """A matched SMELT config and its mismatch table (rows params, flops, kv) at seq_len."""

    baseline: ModelConfig
    smelt: ModelConfig
    table: pd.DataFrame
    seq_len: int

    @property
    def within_tolerance(self) -> bool:
        return bool(self.table["within"].all())

    @property
    def sparsity(self) -> float:
        """The one S the pair shares: the Baseline's (see pair_sparsity)."""
        return sparsity(self.baseline, self.seq_len)


def pair_sparsity(
    base: ModelConfig,
    smelt: ModelConfig,
    seq_len: int | None = None,
    tolerances: dict[str, float] = TOLERANCES,
) -> float | None:
    """The S a matched Baseline/SMELT pair shares, or None when the two are not matched within
    tolerance (then each has only its own S).

    Matched, the pair has the same non-embedding parameters, hence the same dense control, and
    the same active FLOPs, so one S describes both, as in the paper's grid; it is the Baseline's,
    the config SMELT was matched to. (SMELT's own count differs by its FLOP and parameter
    mismatches, which the mismatch table reports.)"""
    seq_len = base.max_seq_len if seq_len is None else seq_len
    if not mismatch_table(base, smelt, seq_len, tolerances)["within"].all():
        return None
    return sparsity(base, seq_len)


def mismatch_table(
    base: ModelConfig, smelt: ModelConfig, seq_len: int, tolerances: dict[str, float] = TOLERANCES
) -> pd.DataFrame:
    """Relative mismatch (smelt / baseline - 1) of params, FLOPs and KV, with tolerances."""
    b, s = Budget.of(base, seq_len), Budget.of(smelt, seq_len)
    rows = []
    for key, bv, sv in (
        ("params", b.params, s.params),
        ("flops", b.flops, s.flops),
        ("kv", b.kv, s.kv),
    ):
        rel = sv / bv - 1.0
        rows.append(
            {
                "quantity": key,
                "baseline": bv,
                "smelt": sv,
                "mismatch": rel,
                "tolerance": tolerances[key],
                "within": abs(rel) <= tolerances[key],
            }
        )
    return pd.DataFrame(rows).set_index("quantity")


def _candidate_heads(
    d_model: int, base: ModelConfig, kv_target: float, depth: int, kv_tol: float
) -> list[tuple[int, int, int]]:
    """(n_heads, d_head, n_kv_heads) whose KV cache is within tolerance of the target and
    whose attention width n_heads * d_head stays within 25% of d_model."""
    out = []
    for d_head in _head_widths(base):
        for n_kv in range(1, 2 * base.n_kv_heads + 1):
            if abs(depth * 4 * n_kv * d_head / kv_target - 1.0) > kv_tol:
                continue
            for n_heads in range(n_kv, 4 * d_model // d_head + 1, n_kv):
                if 0.75 * d_model <= n_heads * d_head <= 1.25 * d_model:
                    out.append((n_heads, d_head, n_kv))
    return out


def _head_widths(base: ModelConfig) -> range:
    """The d_head values the matcher tries: half to twice the Baseline's, even."""
    return range(max(8, base.d_head // 2), 2 * base.d_head + 1, 2)


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
) -> Match:
    """SMELT config matching `base` on FLOPs, KV and parameters at the same physical depth.

    Searches hidden size (narrower, to pay for the extra visits), head layout (to recover the
    cache), expert width (solved from the FLOP target) and expert count (solved from the
    parameter target), scoring by the worst mismatch relative to its tolerance and, among
    equals, by how close the shapes stay to the Baseline's."""
    tol = {**TOLERANCES, **(tolerances or {})}
    seq_len = base.max_seq_len if seq_len is None else seq_len
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
    template = ModelConfig.smelt(
        **{
            **base.to_dict(),
            "loop_start": start,
            "loop_end": end,
            "n_loops": n_loops,
            "name": "smelt",
        }
    )
    target = Budget.of(base, seq_len)
    step = width_step or (16 if base.d_model >= 128 else 8)
    search = (
        len(range(step, base.d_model + 1, step)) * len(_head_widths(base)) * 2 * base.n_kv_heads
    )
    if search > MAX_SEARCH:
        raise MatchError(
            f"matching this Baseline would try {search:,} head layouts (d_model "
            f"{base.d_model}, d_head {base.d_head}, n_kv_heads {base.n_kv_heads}), more than "
            f"{MAX_SEARCH:,}; a larger width_step or a smaller Baseline narrows the search"
        )
    base_ratio = base.d_expert / base.d_model
    best: tuple[float, dict[str, int]] | None = None
    for d_model in range(step, base.d_model + 1, step):
        if d_model < 0.3 * base.d_model:
            continue
        for n_heads, d_head, n_kv in _candidate_heads(
            d_model, base, target.kv, template.effective_depth, tol["kv"]
        ):
            for shape in _expert_options(
                template, target, seq_len, d_model, n_heads, d_head, n_kv, expert_step
            ):
                worst = max(abs(shape[q] / getattr(target, q) - 1.0) / tol[q] for q in tol)
                natural = (
                    abs(math.log((shape["d_expert"] / d_model) / base_ratio))
                    + abs(math.log(n_heads * d_head / d_model))
                    + 0.5 * abs(math.log(n_heads / base.n_heads))
                    + 0.5 * abs(math.log(d_head / base.d_head))
                    + 0.25 * abs(math.log((n_heads / n_kv) / base.n_group))
                )
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
    their params / flops / kv computed by the same formulas as the counters above."""
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
