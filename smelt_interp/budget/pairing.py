"""Comparing a Baseline with its SMELT: the mismatch table of parameters, FLOPs and KV against
their tolerances, the one sparsity a matched pair shares, and the side-by-side budget table."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from smelt_interp.budget.counting import Budget, sparsity
from smelt_interp.config import ModelConfig

TOLERANCES = {"params": 0.01, "flops": 0.04, "kv": 0.04}


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
