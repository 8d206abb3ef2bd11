"""One prompt through one model, for the pages: the forward pass whose activations the pages
read (the prompt box's text becomes ids through smelt_interp.data.prompt_text).

A model's attention rows come from where its shape says (`cfg.attention_source`): SmeltModel's
are recomputed from the cached post-RoPE Q and K (so its fused attention path stays on), an
adapted model's are read from its eager `hook_pattern`, which already holds its masks, windows,
position biases and learned sinks (smelt_interp.measure.position_mass.visit_rows)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from smelt_interp.app.registry import ModelRegistry
from smelt_interp.app.served import Served
from smelt_interp.data.prompt_text import display_labels, encode_prompt, ids_only
from smelt_interp.errors import ProbeError, PromptError, TokenError
from smelt_interp.measure.attention_stats import pattern
from smelt_interp.measure.batching import capture
from smelt_interp.measure.position_mass import RowsFn, pattern_rows, qk_rows
from smelt_interp.measure.sink import first_key_shares
from smelt_interp.model.protocol import hook_name

PATTERN_SOURCE = "pattern"  # ModelShape.attention_source of a model whose rows are its pattern


# ----- one prompt through one model ---------------------------------------------------------
@dataclass
class PromptRun:
    """What one forward pass over a prompt leaves behind for the pages. Patterns are rebuilt
    from cached Q and K per (layer, visit) on first use and kept, or, for a model whose rows are
    its pattern (`source` 'pattern'), read from the captured `patterns`."""

    model: str
    prompt: str
    ids: list[int]
    labels: list[str]
    schedule: tuple[tuple[int, int], ...]
    q: dict[tuple[int, int], torch.Tensor]  # [1, T, H, d]
    k: dict[tuple[int, int], torch.Tensor]  # [1, T, H_kv, d]
    expert_indices: np.ndarray  # [len(schedule), T, top_k] (top_k 0: a dense model)
    expert_weights: np.ndarray  # [len(schedule), T, top_k]
    next_token: list[str]  # the model's argmax label after each position
    # per layer that hides keys (ModelConfig.hidden_key_ids), its hidden keys [1, T]
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    source: str = "qk"  # ModelShape.attention_source
    patterns: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # [1, H, T, T]
    learned_sinks: bool = False  # rows leave mass on a learned sink slot (1 - a row's sum)
    _patterns: dict = field(default_factory=dict, repr=False)

    @property
    def n_tokens(self) -> int:
        return len(self.ids)

    def _check(self, layer: int, visit: int) -> None:
        if (layer, visit) not in self.q:
            raise ProbeError(f"layer {layer} visit {visit} is not executed by {self.model}")

    def rows(self, layer: int, visit: int) -> RowsFn:
        """The attention rows of (layer, visit), a chunk of queries at a time (RowsFn)."""
        self._check(layer, visit)
        if self.source == PATTERN_SOURCE:
            return pattern_rows(self.patterns[(layer, visit)])
        return qk_rows(self.q[(layer, visit)], self.k[(layer, visit)], self.hidden.get(layer))

    def pattern(self, layer: int, visit: int) -> np.ndarray:
        """Attention pattern of every head of (layer, visit): [H, T, T]."""
        key = (layer, visit)
        if key not in self._patterns:
            self._check(layer, visit)
            with torch.no_grad():
                if self.source == PATTERN_SOURCE:
                    rows = self.patterns[key].float()
                else:
                    rows = pattern(self.q[key], self.k[key], hidden=self.hidden.get(layer))
                self._patterns[key] = rows[0].cpu().numpy()
        return self._patterns[key]

    def bos_share(self, layer: int, visit: int) -> np.ndarray:
        """Per head, the mean attention of queries 1.. on BOS: [H]."""
        return self._first_key_shares(layer, visit)[0]

    def slot_share(self, layer: int, visit: int) -> np.ndarray:
        """Per head, the mean over queries 1.. of the mass on a learned sink slot (1 minus the
        row's sum): [H]; rounding noise for a model without one."""
        return self._first_key_shares(layer, visit)[1]

    def _first_key_shares(self, layer: int, visit: int) -> tuple[np.ndarray, np.ndarray]:
        """measure.sink.first_key_shares of the (layer, visit) pattern this run keeps."""
        weights = torch.from_numpy(self.pattern(layer, visit))[None]
        return first_key_shares(pattern_rows(weights), self.n_tokens, None)

    def structured_head(self, layer: int, visit: int) -> int:
        """The head whose attention leaves BOS most (the one with the most visible structure)."""
        return int(np.argmin(self.bos_share(layer, visit)))

    def routing(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """Experts and weights of the token at `position` in each scheduled visit: [S, k] x2."""
        return self.expert_indices[:, position], self.expert_weights[:, position]


ROUTING_HOOKS = ("moe.hook_expert_indices", "moe.hook_expert_weights")


def run_prompt(registry: ModelRegistry, model_name: str, prompt: str) -> PromptRun:
    """One forward pass caching the hook points the pages read: Q and K, the router's picks
    where the model routes, and the pattern only where the model's rows are its pattern (a
    SmeltModel's pattern hook stays off, so its fused attention path stays on)."""
    model = registry.get(model_name)
    cfg = model.cfg
    tokenizer = registry.tokenizer(model_name)
    ids = encode_prompt(prompt, cfg.max_seq_len, tokenizer, cfg.vocab_size)
    schedule = tuple(model.schedule)
    source = getattr(cfg, "attention_source", "qk")
    routes = cfg.n_experts > 1  # a dense feed-forward has no router hooks to read
    hooks = ("attn.hook_q", "attn.hook_k")
    hooks += ("attn.hook_pattern",) if source == PATTERN_SOURCE else ()
    hooks += ROUTING_HOOKS if routes else ()
    names = [hook_name(layer, visit, h) for layer, visit in schedule for h in hooks]
    tokens = torch.tensor([ids], dtype=torch.long)
    try:
        with registry.using(model_name):
            logits, cache = capture(model, tokens, names)
    except TokenError as exc:
        raise PromptError(f"{exc}. Edit the prompt and run again.") from None
    get = lambda lv, h: cache[hook_name(*lv, h)].detach().cpu()  # noqa: E731
    if routes:
        indices = np.stack([get(lv, ROUTING_HOOKS[0])[0].numpy() for lv in schedule])
        weights = np.stack([get(lv, ROUTING_HOOKS[1])[0].float().numpy() for lv in schedule])
    else:
        indices = np.zeros((len(schedule), len(ids), 0), dtype=np.int64)
        weights = np.zeros((len(schedule), len(ids), 0), dtype=np.float32)
    patterns = {}
    if source == PATTERN_SOURCE:
        patterns = {lv: get(lv, "attn.hook_pattern") for lv in schedule}
    return PromptRun(
        model=model_name,
        prompt=prompt,
        ids=ids,
        labels=display_labels(ids, tokenizer),
        schedule=schedule,
        q={lv: get(lv, "attn.hook_q") for lv in schedule},
        k={lv: get(lv, "attn.hook_k") for lv in schedule},
        expert_indices=indices,
        expert_weights=weights,
        next_token=display_labels(logits[0].argmax(-1).tolist(), tokenizer),
        hidden={layer: h.cpu() for layer, h in model.hidden_keys(tokens).items()},
        source=source,
        patterns=patterns,
        learned_sinks=bool(getattr(cfg, "learned_sinks", False)),
    )


def cached_run(served: Served, model: str, prompt: str) -> PromptRun:
    """run_prompt of (model, prompt), once per model version and prompt (served.prompts)."""
    registry = served.registry
    model = registry.valid(model)
    key = (model, registry.version(model), prompt)
    return served.prompts.get_or_compute(key, lambda: run_prompt(registry, model, prompt))


def prompt_labels(served: Served, model: str | None, prompt: str | None) -> list[str]:
    """The token labels cached_run(model, prompt) would show, from the tokenizer alone (no
    forward pass: what a page lays out before its figures arrive); PromptError as it raises."""
    registry = served.registry
    model = registry.valid(model)
    tokenizer, cfg = registry.tokenizer(model), registry.cfg(model)
    ids = encode_prompt(prompt, cfg.max_seq_len, tokenizer, cfg.vocab_size)
    return display_labels(ids, tokenizer)


def context_note(served: Served, model: str | None) -> str:
    """Where a prompt is typed: how many tokens `model` reads (and, for a model without a
    tokenizer, that its prompt is a row of ids)."""
    registry = served.registry
    name = registry.valid(model)
    cfg = registry.cfg(name)
    if ids_only(registry.tokenizer(name)):
        return (
            f"{name} has no tokenizer: give its row as token ids, 'ids: 1,17,42' (ids "
            f"0..{cfg.vocab_size - 1}, at most {cfg.max_seq_len})."
        )
    return f"{name} reads at most {cfg.max_seq_len} tokens, BOS included."
