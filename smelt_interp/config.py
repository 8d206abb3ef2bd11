"""Model configuration: one validated dataclass for SMELT and Baseline alike, with the layer
schedule derived from it. A Baseline is the same config with no loop (n_loops = 1 or an empty
span), so every ablation of the paper (span, r = 2..4, full-stack loop) is a field change."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smelt_interp.errors import ConfigError
from smelt_interp.fields import (
    check_fields,
    choice_field,
    ids_field,
    int_field,
    is_int,
    known_fields,
    plain,
    real_field,
    shown,
)
from smelt_interp.machine import GIB, memory_limit_bytes

# The two architectures of the paper's pair, as run folders, checkpoints, tables and pages name
# them: the unlooped Baseline and the looped SMELT model matched to it.
BASELINE = "baseline"
SMELT = "smelt"
ARCHS: tuple[str, str] = (BASELINE, SMELT)
UNLOOPED = {"loop_start": 0, "loop_end": 0, "n_loops": 1}  # the loop fields of an unlooped model

Schedule = tuple[tuple[int, int], ...]

# The fields that size a model (a preset's or a ladder size's `model` names these).
SHAPE_FIELDS = tuple("d_model n_layers n_heads n_kv_heads d_head n_experts top_k d_expert".split())
# Where positions enter (ModelConfig.positions): rotary on queries and keys, or a learned
# absolute embedding added to the token embedding (GPT-2 style, as Guo et al. 2024's
# Bigram-Backcopy model). Which norm the pre-norm sublayers use (ModelConfig.norm).
POSITIONS = ("rope", "learned")
NORMS = ("rms", "layer")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a byte-level pre-norm MoE transformer with an optional looped span.

    Layers `loop_start .. loop_end - 1` run `n_loops` times as a block (0,1,2,3,2,3,4,...),
    and each of their sublayer writes is scaled by 1 / n_loops. The defaults are the shape of
    the default pair (preset dyck-pair) and of the CPU ladder's largest size."""

    # The sizes' upper bounds are far above any model this workbench trains or probes, low
    # enough that a damaged or hostile config is refused before anything is allocated.
    vocab_size: int = int_field(259, 1, 1 << 20)
    d_model: int = int_field(128, 1, 1 << 16)
    n_layers: int = int_field(4, 1, 1024)
    n_heads: int = int_field(4, 1, 1024)
    n_kv_heads: int = int_field(2, 1, 1024)
    d_head: int = int_field(32, 1, 4096)
    n_experts: int = int_field(8, 1, 4096)
    top_k: int = int_field(2, 1, 4096)
    d_expert: int = int_field(128, 1, 1 << 18)
    loop_start: int = 0
    loop_end: int = 0
    n_loops: int = int_field(1, 1, 64)
    max_seq_len: int = int_field(512, 1, 1 << 20)
    bos_token_id: int = 257
    rope_theta: float = real_field(10000.0, 0.0, None, "()")
    norm_eps: float = real_field(1e-6, 0.0, None, "()")
    init_std: float = real_field(0.02, 0.0, None, "()")
    # The defaults are every model's here; "learned" positions and "layer" norm exist for the
    # attention-sink control (docs/results/sink_control.md), which follows Guo et al.'s model.
    positions: str = choice_field("rope", POSITIONS)
    norm: str = choice_field("rms", NORMS)
    # Token ids whose keys the attention of layers `hide_keys_from` and up cannot see (none by
    # default). A head that finds its target by content can rest on any key of constant
    # content: in the recall pair the fixed trigger bytes compete with BOS for the idle mass,
    # and hiding them from the retrieval layers leaves BOS the one resting place
    # (docs/results/recall_sweep.md). The key at position 0 is never hidden.
    hidden_key_ids: tuple[int, ...] = ids_field()
    hide_keys_from: int = int_field(1, 0, 1024)
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.hidden_key_ids, list):  # as JSON and to_dict give it
            object.__setattr__(self, "hidden_key_ids", tuple(self.hidden_key_ids))
        check_fields(self)
        for name in ("loop_start", "loop_end", "bos_token_id"):  # bounded by the checks below
            value = getattr(self, name)
            if not is_int(value):
                raise ConfigError(f"{name} must be an integer, got {shown(value)}")
        if not isinstance(self.name, str):
            raise ConfigError(f"name must be a string, got {shown(self.name)}")
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
        self._check_hidden_keys()

    def _check_hidden_keys(self) -> None:
        ids = self.hidden_key_ids
        if any(i >= self.vocab_size for i in ids):
            raise ConfigError(
                f"hidden_key_ids must lie in 0..vocab_size-1 ({self.vocab_size - 1}), got "
                f"{shown(list(ids))}"
            )
        if self.bos_token_id in ids:
            raise ConfigError(
                f"hidden_key_ids must not hide BOS ({self.bos_token_id}): it is the key every "
                "query can rest on"
            )
        if ids and self.hide_keys_from >= self.n_layers:
            raise ConfigError(
                f"hide_keys_from ({self.hide_keys_from}) must name a layer below n_layers "
                f"({self.n_layers}) when hidden_key_ids is set"
            )

    # ----- constructors for the paper's pair -------------------------------------------
    @classmethod
    def baseline(cls, **fields: Any) -> ModelConfig:
        """An unlooped model (r = 1)."""
        fields.setdefault("name", BASELINE)
        return cls(**{**fields, **UNLOOPED})

    @classmethod
    def smelt(cls, n_loops: int = 2, **fields: Any) -> ModelConfig:
        """The paper's recipe: the middle half of the layers (L/4 .. 3L/4 - 1) runs n_loops
        times."""
        n_layers = fields.get("n_layers", cls.n_layers)
        fields.setdefault("loop_start", n_layers // 4)
        fields.setdefault("loop_end", (3 * n_layers) // 4)
        fields.setdefault("name", SMELT)
        cfg = cls(n_loops=n_loops, **fields)
        if not cfg.is_looped:
            raise ConfigError(
                f"a SMELT config needs a non-empty loop span and n_loops >= 2 "
                f"(got span {cfg.loop_start}..{cfg.loop_end}, n_loops={n_loops})"
            )
        return cfg

    def shape(self) -> dict[str, int]:
        """The width and depth fields (SHAPE_FIELDS), as a preset or a ladder size names them:
        `ModelConfig().shape()` is the default pair's shape."""
        return {name: getattr(self, name) for name in SHAPE_FIELDS}

    # ----- derived quantities ------------------------------------------------------------
    @property
    def is_looped(self) -> bool:
        return self.loop_end > self.loop_start and self.n_loops > 1

    @property
    def loop_text(self) -> str:
        """The loop in words, as reports and pages show it: 'layers 1..2 x 2' or 'none'."""
        if not self.is_looped:
            return "none"
        return f"layers {self.loop_start}..{self.loop_end - 1} x {self.n_loops}"

    @property
    def n_group(self) -> int:
        """Query heads per key/value head (GQA ratio)."""
        return self.n_heads // self.n_kv_heads

    @property
    def first_token_id(self) -> int:
        """The token every row starts with (the probes' protocol, model.protocol.ModelShape)."""
        return self.bos_token_id

    @property
    def learned_sinks(self) -> bool:
        """No learned sink slot: all attention mass lands on keys."""
        return False

    @property
    def attention_source(self) -> str:
        """Plain causal softmax: rows are recomputed from the cached post-RoPE Q and K."""
        return "qk"

    def visits_of(self, layer: int) -> int:
        """How many times `layer` runs in one forward pass."""
        return self.n_loops if self.is_looped and self.loop_start <= layer < self.loop_end else 1

    def hides_keys(self, layer: int) -> bool:
        """Whether the attention of `layer` cannot see the keys of `hidden_key_ids`."""
        return bool(self.hidden_key_ids) and layer >= self.hide_keys_from

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

    @property
    def n_params(self) -> int:
        """Every parameter: embeddings, unembedding, attention, routers, experts and norms."""
        d, layers = self.d_model, self.n_layers
        attention = 2 * d * self.d_head * (self.n_heads + self.n_kv_heads)
        moe = self.n_experts * (d + 3 * d * self.d_expert)
        norm = d if self.norm == "rms" else 2 * d  # LayerNorm adds a bias
        positions = self.max_seq_len * d if self.positions == "learned" else 0
        return layers * (attention + moe + 2 * norm) + norm + 2 * self.vocab_size * d + positions

    @property
    def build_bytes(self) -> int:
        """Peak memory of building the model: float32 parameters, plus the RoPE tables
        (float64 angles and their cosines while computing, float32 cos/sin kept)."""
        return 4 * self.n_params + 32 * self.max_seq_len * self.d_head

    def check_memory(self, limit: int | None = None) -> None:
        """Raise a ConfigError if building this model needs more than `limit` bytes (by default
        this machine's RAM, see memory_limit_bytes). Call it before allocating the model."""
        limit = memory_limit_bytes() if limit is None else limit
        if self.build_bytes > limit:
            raise ConfigError(
                f"this model needs about {self.build_bytes / GIB:,.1f} GiB to build "
                f"({self.n_params:,} parameters and RoPE tables for max_seq_len "
                f"{self.max_seq_len:,}), more than the {limit / GIB:,.1f} GiB of RAM here"
            )

    # ----- (de)serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields (a tuple as a list), as checkpoints and run records save them."""
        return plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """Build from a plain mapping, naming any unknown field instead of a TypeError."""
        return cls(**known_fields(cls, data, "model"))

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)
