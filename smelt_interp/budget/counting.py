"""Counting one config's budgets (paper section 3.2): non-embedding parameters, forward FLOPs
per token at a sequence length (2 x active matmul parameters per executed layer plus attention
scores and values over the full context, so a looped layer counts once per visit), KV-cache
bytes per token (one entry per visit), and the compute-equivalent sparsity
S = 1 - F_active / F_dense."""

from __future__ import annotations

from dataclasses import dataclass

from smelt_interp.config import ModelConfig
from smelt_interp.errors import ConfigError


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
