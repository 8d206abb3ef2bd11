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

The code lives in counting.py (one config's budgets), pairing.py (a pair's mismatch and
shared S), matcher.py (the search) and kernel.py (the search for a pair whose widths fill the
GPU kernels' tiles, `match_kernel_friendly`); this package re-exports it.
`python -m smelt_interp.budget` prints the matched pair for a Baseline shape (see __main__.py)."""

from smelt_interp.budget.counting import (
    Budget,
    dense_flops_per_token,
    flops_per_token,
    kv_bytes_per_token,
    layer_flops_per_token,
    non_embedding_params,
    param_breakdown,
    sparsity,
)
from smelt_interp.budget.kernel import match_kernel_friendly, misaligned
from smelt_interp.budget.matcher import MAX_SEARCH, match_smelt
from smelt_interp.budget.pairing import (
    TOLERANCES,
    Match,
    budget_table,
    mismatch_table,
    pair_sparsity,
)

__all__ = [
    "MAX_SEARCH",
    "TOLERANCES",
    "Budget",
    "Match",
    "budget_table",
    "dense_flops_per_token",
    "flops_per_token",
    "kv_bytes_per_token",
    "layer_flops_per_token",
    "match_kernel_friendly",
    "match_smelt",
    "misaligned",
    "mismatch_table",
    "non_embedding_params",
    "pair_sparsity",
    "param_breakdown",
    "sparsity",
]
