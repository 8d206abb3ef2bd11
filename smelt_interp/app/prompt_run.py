"""One prompt through one model, for the pages: the prompt box's text as token ids (text through
the model's tokenizer, or a row of ids written `ids: 1,17,42`, which any model takes and a model
folder without a tokenizer needs), and the forward pass whose activations the pages read.

A model's attention rows come from where its shape says (`cfg.attention_source`): SmeltModel's
are recomputed from the cached post-RoPE Q and K (so its fused attention path stays on), an
adapted model's are read from its eager `hook_pattern`, which already holds its masks, windows,
position biases and learned sinks (smelt_interp.measure.position_mass.visit_rows)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import torch

from smelt_interp.app.registry import ModelRegistry
from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.folder_tokenizer import IdsTokenizer
from smelt_interp.data.tokenizer import ByteTokenizer
from smelt_interp.errors import ProbeError, PromptError, TokenError, TokenizerError
from smelt_interp.measure.attention_stats import pattern
from smelt_interp.measure.batching import capture
from smelt_interp.measure.position_mass import RowsFn, pattern_rows, qk_rows
from smelt_interp.measure.sink import first_key_shares
from smelt_interp.model.protocol import hook_name

TOKENIZER = ByteTokenizer()
IDS_PREFIX = "ids:"  # a prompt written as token ids: "ids: 1,17,42"
IDS_SYNTAX = (
    "Or give the row as token ids: 'ids: 1,17,42' (comma- or space-separated, taken as the "
    "whole row, no BOS added)."
)
PATTERN_SOURCE = "pattern"  # ModelShape.attention_source of a model whose rows are its pattern


# ----- prompts ------------------------------------------------------------------------------
def display_labels(ids: list[int], tokenizer: Tokenizer = TOKENIZER) -> list[str]:
    """The tokenizer's labels (the model's own: a BPE model's tokens decoded) with newline and
    tab drawn as visible symbols."""
    shown = {"\\x0a": "⏎", "\\x09": "⇥"}
    return [
        shown.get(label, label).replace("\n", "⏎").replace("\t", "⇥")
        for label in tokenizer.token_labels(ids)
    ]


def ids_only(tokenizer: Tokenizer) -> bool:
    """Whether the model has no tokenizer (a model folder without tokenizer.json): its prompts
    can only be rows of ids."""
    return isinstance(tokenizer, IdsTokenizer)


def is_ids_prompt(text: str | None) -> bool:
    return text is not None and str(text).strip().lower().startswith(IDS_PREFIX)


def ids_prompt(ids: list[int]) -> str:
    """The prompt box's text for a row of ids."""
    return f"{IDS_PREFIX} " + ",".join(str(int(i)) for i in ids)


def parse_ids(text: str, vocab_size: int | None = None) -> list[int]:
    """The ids of an `ids: 1,17,42` prompt, or PromptError saying what is wrong."""
    body = str(text).strip()[len(IDS_PREFIX) :]
    parts = [p for p in re.split(r"[\s,]+", body) if p]
    if not parts:
        raise PromptError("No token ids after 'ids:'; write them as 'ids: 1,17,42'.")
    bad = [p for p in parts if not re.fullmatch(r"\d+", p)]
    if bad:
        raise PromptError(
            f"'{bad[0][:20]}' is not a token id; write the row as 'ids: 1,17,42' "
            "(whole numbers, comma- or space-separated)."
        )
    ids = [int(p) for p in parts]
    if vocab_size is not None and max(ids) >= vocab_size:
        raise PromptError(
            f"Token id {max(ids)} is outside the model's vocabulary (0..{vocab_size - 1}). "
            "Edit the ids and run again."
        )
    return ids


def encode_prompt(
    text: str | None,
    max_seq_len: int,
    tokenizer: Tokenizer = TOKENIZER,
    vocab_size: int | None = None,
) -> list[int]:
    """BOS + the prompt's tokens (or the ids of an `ids:` prompt, as they are), or PromptError
    with a message for the page. `vocab_size`: the model's, that ids must stay below."""
    if text is None or not str(text).strip():
        raise PromptError("The prompt is empty: type some text and press Run.")
    if is_ids_prompt(text):
        ids = parse_ids(str(text), vocab_size)
    else:
        try:
            ids = tokenizer.encode(str(text))
        except TokenizerError as exc:
            hint = "" if not ids_only(tokenizer) else f" {IDS_SYNTAX}"
            raise PromptError(
                f"The tokenizer cannot encode this prompt ({exc}). Edit it and run again.{hint}"
            ) from None
    if len(ids) > max_seq_len:
        raise PromptError(
            f"The prompt is {len(ids)} tokens long (with BOS), but the model allows at "
            f"most {max_seq_len}. Shorten it and run again."
        )
    return ids


def prompt_error(text: str | None, max_seq_len: int) -> str | None:
    """The page's message for a prompt it cannot use, or None."""
    try:
        encode_prompt(text, max_seq_len)
    except PromptError as exc:
        return str(exc)
    return None


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
