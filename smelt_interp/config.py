"""Model configuration: one validated dataclass for SMELT and Baseline alike, with the layer
schedule derived from it. A Baseline is the same config with no loop (n_loops = 1 or an empty
span), so every ablation of the paper (span, r = 2..4, full-stack loop) is a field change."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smelt_interp.errors import ConfigError

Schedule = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a byte-level pre-norm MoE transformer with an optional looped span.

    Layers `loop_start .. loop_end - 1` run `n_loops` times as a block (0,1,2,3,2,3,4,...),
    and each of their sublayer writes is scaled by 1 / n_loops."""

    vocab_size: int = 259
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    d_head: int = 32
    n_experts: int = 8
    top_k: int = 2
    d_expert: int = 128
    loop_start: int = 0
    loop_end: int = 0
    n_loops: int = 1
    max_seq_len: int = 512
    bos_token_id: int = 257
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        positive = (
            "vocab_size",
            "d_model",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "d_head",
            "n_experts",
            "top_k",
            "d_expert",
            "n_loops",
            "max_seq_len",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.top_k > self.n_experts:
            raise ConfigError(f"top_k ({self.top_k}) must not exceed n_experts ({self.n_experts})")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.d_head % 2:
            raise ConfigError(f"d_head must be even for rotary embeddings, got {self.d_head}")
        if not 0 <= self.loop_start <= self.loop_end <= self.n_layers:
            raise ConfigError(
                f"loop span loop_start={self.loop_start}, loop_end={self.loop_end} must satisfy "
                f"0 <= loop_start <= loop_end <= n_layers ({self.n_layers})"
            )
        if not 0 <= self.bos_token_id < self.vocab_size:
            raise ConfigError(
                f"bos_token_id ({self.bos_token_id}) must lie in 0..vocab_size-1 "
                f"({self.vocab_size - 1})"
            )
        for name in ("rope_theta", "norm_eps", "init_std"):
            if not float(getattr(self, name)) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)!r}")

    # ----- constructors for the paper's pair -------------------------------------------
    @classmethod
    def baseline(cls, **fields: Any) -> ModelConfig:
        """An unlooped model (r = 1)."""
        fields.setdefault("name", "baseline")
        return cls(**{**fields, "loop_start": 0, "loop_end": 0, "n_loops": 1})

    @classmethod
    def smelt(cls, n_loops: int = 2, **fields: Any) -> ModelConfig:
        """The paper's recipe: the middle half of the layers (L/4 .. 3L/4 - 1) runs n_loops
        times."""
        n_layers = fields.get("n_layers", cls.n_layers)
        fields.setdefault("loop_start", n_layers // 4)
        fields.setdefault("loop_end", (3 * n_layers) // 4)
        fields.setdefault("name", "smelt")
        cfg = cls(n_loops=n_loops, **fields)
        if not cfg.is_looped:
            raise ConfigError(
                f"a SMELT config needs a non-empty loop span and n_loops >= 2 "
                f"(got span {cfg.loop_start}..{cfg.loop_end}, n_loops={n_loops})"
            )
        return cfg

    # ----- derived quantities ------------------------------------------------------------
    @property
    def is_looped(self) -> bool:
        return self.loop_end > self.loop_start and self.n_loops > 1

    @property
    def n_group(self) -> int:
        """Query heads per key/value head (GQA ratio)."""
        return self.n_heads // self.n_kv_heads

    def visits_of(self, layer: int) -> int:
        """How many times `layer` runs in one forward pass."""
        return self.n_loops if self.is_looped and self.loop_start <= layer < self.loop_end else 1

    def residual_scale(self, layer: int) -> float:
        """Factor on each sublayer write of `layer`: 1/r inside the looped span, else 1."""
        return 1.0 / self.visits_of(layer)

    @property
    def schedule(self) -> Schedule:
        """(layer, visit) pairs in execution order; the loop repeats the whole span."""
        order = [
            (layer, 0) for layer in range(self.loop_start if self.is_looped else self.n_layers)
        ]
        if self.is_looped:
            for visit in range(self.n_loops):
                order += [(layer, visit) for layer in range(self.loop_start, self.loop_end)]
            order += [(layer, 0) for layer in range(self.loop_end, self.n_layers)]
        return tuple(order)

    @property
    def effective_depth(self) -> int:
        return len(self.schedule)

    @property
    def looped_layers(self) -> tuple[int, ...]:
        return tuple(range(self.loop_start, self.loop_end)) if self.is_looped else ()

    # ----- (de)serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """Build from a plain mapping, naming any unknown field instead of a TypeError."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"config must be a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s): {', '.join(unknown)}")
        return cls(**dict(data))

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)
