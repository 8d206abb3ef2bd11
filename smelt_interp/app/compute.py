"""The server-side work behind the pages, cached: one forward pass per (model, prompt) whose
activations (post-RoPE Q/K of every visit, the router's picks) sit in an LRU so changing a
head, visit or token never reruns the model; the probes' tables on a default batch of Dyck
prompts, once per model; the Dyck case study per (model, prompt). Everything here calls the
model, the probes and the data package; nothing here draws or imports Dash.

The server answers each request in its own thread. Threads share the caches: a key is computed
once while other threads asking for it wait, other keys compute meanwhile, and a hit never
waits; a model runs one forward pass at a time (ModelRegistry.using), different models at
once."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from smelt_interp.app.registry import ModelRegistry
from smelt_interp.data.dyck import (
    DyckExample,
    DyckSpec,
    build_example,
    dyck_batch,
    dyck_max_len,
    make_dataset,
)
from smelt_interp.data.dyck_eval import complete
from smelt_interp.data.tokenizer import ByteTokenizer
from smelt_interp.errors import DataError, ProbeError, PromptError, TokenError, TokenizerError
from smelt_interp.model.transformer import hook_name
from smelt_interp.probes import dyck as dyck_probe
from smelt_interp.probes import residual, routing, similarity, sink
from smelt_interp.probes.attention_stats import pattern
from smelt_interp.probes.common import capture
from smelt_interp.probes.inputs import ProbeInputs, dyck_prompts
from smelt_interp.probes.registry import ProbeOptions, ProbeSpec, Tables
from smelt_interp.train.run_folder import METRICS_FILE
from smelt_interp.train.sink_eval import sink_history

TOKENIZER = ByteTokenizer()
CACHE_SIZE = 16
BATCH_DEMOS = (0, 1, 2, 4)  # demonstration counts of the default probe batch
BATCH_PER_COUNT = 4  # prompts per count: 16 held-out Dyck prompts
AGGREGATE_PER_COUNT = 24  # the Dyck page's aggregate: 96 held-out prompts per model
AGGREGATE_SEED = 1
DEFAULT_DYCK = {"pairs": 4, "depth": 4, "demos": 2, "seed": 0}


# ----- prompts ------------------------------------------------------------------------------
def display_labels(ids: list[int]) -> list[str]:
    """The tokenizer's labels with newline and tab drawn as visible symbols."""
    shown = {"\\x0a": "⏎", "\\x09": "⇥"}
    return [shown.get(label, label) for label in TOKENIZER.token_labels(ids)]


def encode_prompt(text: str | None, max_seq_len: int) -> list[int]:
    """BOS + the prompt's bytes, or PromptError with a message for the page."""
    if text is None or not str(text).strip():
        raise PromptError("The prompt is empty: type some text and press Run.")
    try:
        ids = TOKENIZER.encode(str(text))
    except TokenizerError as exc:
        raise PromptError(
            f"The tokenizer cannot encode this prompt ({exc}). Edit it and run again."
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


def default_prompt() -> str:
    """An in-context Dyck example (two demonstrations, then a query and its answer)."""
    spec = DyckSpec(n_pairs=4, max_depth=4, max_len=10)
    ex = make_dataset(1, spec=spec, n_demos=2, seed=3, split="heldout")[0]
    return ex.text


# ----- a small thread-safe LRU -------------------------------------------------------------
class LRU:
    """get_or_compute(key, fn): the cached value, or fn() stored under key. Threads asking for
    one key share one computation (the others wait for it); different keys compute in parallel
    and a hit never waits for another key's work. Counts hits and misses."""

    def __init__(self, maxsize: int = CACHE_SIZE) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()  # guards _data, _pending and the counts, never held long
        self._pending: dict[Hashable, threading.Event] = {}  # keys being computed
        self.hits = 0
        self.misses = 0

    def get_or_compute(self, key: Hashable, fn: Callable[[], Any]) -> Any:
        while True:
            with self._lock:
                if key in self._data:
                    self._data.move_to_end(key)
                    self.hits += 1
                    return self._data[key]
                done = self._pending.get(key)
                if done is None:
                    done = self._pending[key] = threading.Event()
                    self.misses += 1
                    break
            done.wait()  # another thread computes this key; then look again
        try:
            value = fn()
            with self._lock:
                self._data[key] = value
                while len(self._data) > self.maxsize:
                    self._data.popitem(last=False)
            return value
        finally:
            with self._lock:
                del self._pending[key]
            done.set()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)


# ----- one prompt through one model ---------------------------------------------------------
@dataclass
class PromptRun:
    """What one forward pass over a prompt leaves behind for the pages. Patterns are rebuilt
    from cached Q and K per (layer, visit) on first use and kept."""

    model: str
    prompt: str
    ids: list[int]
    labels: list[str]
    schedule: tuple[tuple[int, int], ...]
    q: dict[tuple[int, int], torch.Tensor]  # [1, T, H, d]
    k: dict[tuple[int, int], torch.Tensor]  # [1, T, H_kv, d]
    expert_indices: np.ndarray  # [len(schedule), T, top_k]
    expert_weights: np.ndarray  # [len(schedule), T, top_k]
    next_token: list[str]  # the model's argmax label after each position
    _patterns: dict = field(default_factory=dict, repr=False)

    @property
    def n_tokens(self) -> int:
        return len(self.ids)

    def pattern(self, layer: int, visit: int) -> np.ndarray:
        """Attention pattern of every head of (layer, visit): [H, T, T]."""
        key = (layer, visit)
        if key not in self._patterns:
            if key not in self.q:
                raise ProbeError(f"layer {layer} visit {visit} is not executed by {self.model}")
            with torch.no_grad():
                self._patterns[key] = pattern(self.q[key], self.k[key])[0].cpu().numpy()
        return self._patterns[key]

    def bos_share(self, layer: int, visit: int) -> np.ndarray:
        """Per head, the mean attention of queries 1.. on BOS: [H]."""
        p = self.pattern(layer, visit)
        return p[:, 1:, 0].mean(axis=1) if p.shape[1] > 1 else p[:, :, 0].mean(axis=1)

    def structured_head(self, layer: int, visit: int) -> int:
        """The head whose attention leaves BOS most (the one with the most visible structure)."""
        return int(np.argmin(self.bos_share(layer, visit)))

    def routing(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """Experts and weights of the token at `position` in each scheduled visit: [S, k] x2."""
        return self.expert_indices[:, position], self.expert_weights[:, position]


def run_prompt(registry: ModelRegistry, model_name: str, prompt: str) -> PromptRun:
    """One forward pass caching the hook points the pages read (never the pattern hook, so
    the fused attention path stays on)."""
    model = registry.get(model_name)
    ids = encode_prompt(prompt, model.cfg.max_seq_len)
    schedule = tuple(model.schedule)
    names = [
        hook_name(layer, visit, h)
        for layer, visit in schedule
        for h in (
            "attn.hook_q",
            "attn.hook_k",
            "moe.hook_expert_indices",
            "moe.hook_expert_weights",
        )
    ]
    try:
        with registry.using(model_name):
            logits, cache = capture(model, torch.tensor([ids], dtype=torch.long), names)
    except TokenError as exc:
        raise PromptError(f"{exc}. Edit the prompt and run again.") from None
    get = lambda lv, h: cache[hook_name(*lv, h)].detach().cpu()  # noqa: E731
    return PromptRun(
        model=model_name,
        prompt=prompt,
        ids=ids,
        labels=display_labels(ids),
        schedule=schedule,
        q={lv: get(lv, "attn.hook_q") for lv in schedule},
        k={lv: get(lv, "attn.hook_k") for lv in schedule},
        expert_indices=np.stack([get(lv, "moe.hook_expert_indices")[0].numpy() for lv in schedule]),
        expert_weights=np.stack(
            [get(lv, "moe.hook_expert_weights")[0].float().numpy() for lv in schedule]
        ),
        next_token=display_labels(logits[0].argmax(-1).tolist()),
    )


# ----- the Dyck case study ------------------------------------------------------------------
def parse_dyck_lines(text: str | None) -> tuple[str, list[str]]:
    """'demo\\n...\\nquery' -> (query, demos): one bracket prefix per non-empty line, the last
    the query. Lines may be written 'Input: ( [ Output: ] )' too (the part after Input:)."""
    lines = []
    for raw in (text or "").splitlines():
        line = raw.strip()
        if line.startswith("Input:"):
            line = line[len("Input:") :].split("Output:")[0]
        if line.strip():
            lines.append(line.strip())
    if not lines:
        raise PromptError("Type at least one line of brackets (the query), e.g. '( [ {'.")
    return lines[-1], lines[:-1]


def generate_dyck(pairs: int, depth: int, demos: int, seed: int, max_seq_len: int) -> str:
    """A held-out in-context prompt as page text: demonstrations' inputs then the query, one a
    line; words short enough that the whole example fits `max_seq_len`."""
    longest = dyck_max_len(max_seq_len, demos)
    if longest < 2:
        raise PromptError(
            f"{demos} demonstrations do not fit the model's {max_seq_len} tokens; use fewer."
        )
    try:
        ex = make_dataset(
            1,
            spec=DyckSpec(
                n_pairs=pairs, max_depth=max(1, min(depth, longest // 2)), max_len=longest
            ),
            n_demos=demos,
            seed=seed,
            split="heldout",
        )[0]
    except DataError as exc:
        raise PromptError(str(exc)) from None
    return "\n".join([p for p, _ in ex.demos] + [ex.query])


def dyck_example(text: str | None, max_seq_len: int) -> DyckExample:
    query, demos = parse_dyck_lines(text)
    try:
        ex = build_example(query, demos)
    except (DataError, TokenizerError) as exc:
        raise PromptError(f"Not a usable Dyck prompt: {exc}") from None
    if len(ex.ids) > max_seq_len:
        raise PromptError(
            f"This example is {len(ex.ids)} tokens long; the model allows {max_seq_len}. "
            f"Use fewer or shorter demonstrations."
        )
    return ex


@dataclass(frozen=True)
class DyckCase:
    """One model on one in-context Dyck prompt."""

    model: str
    example: DyckExample
    completion: str
    correct: bool
    visits: pd.DataFrame  # probes.dyck.by_visit of this one example


def run_dyck(registry: ModelRegistry, model_name: str, text: str) -> DyckCase:
    ex = dyck_example(text, registry.cfg(model_name).max_seq_len)
    with registry.using(model_name) as model:
        try:
            answer = complete(model, ex.query, demos=ex.demos)
        except (DataError, TokenizerError) as exc:
            raise PromptError(str(exc)) from None
        measured = dyck_probe.measure(model, [ex])
    visits = dyck_probe.by_visit(measured)
    return DyckCase(model_name, ex, answer, answer == ex.answer, visits)


# ----- everything together ------------------------------------------------------------------
class Workbench:
    """The app's server-side state: the models, the per-prompt LRU, the Dyck LRU and the
    default-batch probe tables."""

    def __init__(self, registry: ModelRegistry, cache_size: int = CACHE_SIZE) -> None:
        self.registry = registry
        self.prompts = LRU(cache_size)
        self.dyck = LRU(cache_size)
        self.tables = LRU(maxsize=64)
        self.default_prompt = default_prompt()

    # per (model, prompt)
    def run(self, model: str, prompt: str) -> PromptRun:
        model = self.registry.valid(model)
        self.registry.get(model)
        return self.prompts.get_or_compute(
            (model, prompt), lambda: run_prompt(self.registry, model, prompt)
        )

    def dyck_case(self, model: str, text: str) -> DyckCase:
        return self.dyck.get_or_compute((model, text), lambda: run_dyck(self.registry, model, text))

    @property
    def max_seq_len(self) -> int:
        return min(m.cfg.max_seq_len for m in self.registry.models.values())

    # the default batch, once per model
    def batch(self, model: str) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.registry.cfg(model).max_seq_len
        return self.tables.get_or_compute(
            ("batch", n), lambda: dyck_batch(dyck_prompts(BATCH_PER_COUNT, BATCH_DEMOS, n, seed=0))
        )

    def _table(self, probe: str, model: str, fn: Callable[..., Any]) -> Any:
        """fn(model, tokens, lengths) on the default batch, once per (probe, model), with the
        model held (registry.using) while it runs."""

        def compute() -> Any:
            batch = self.batch(model)
            with self.registry.using(model) as m:
                return fn(m, *batch)

        return self.tables.get_or_compute((probe, model), compute)

    def sink(self, model: str) -> pd.DataFrame:
        return self._table("sink", model, lambda m, t, n: sink.by_visit(sink.measure(m, t, n)))

    def sink_training(self, model: str) -> pd.DataFrame:
        """The sink over training from the metrics.jsonl beside the model's checkpoint (read
        each time: a run may still be writing it); empty when there is none."""
        path = self.registry.paths[self.registry.valid(model)]
        return sink_history(path.parent / METRICS_FILE) if path.is_file() else sink_history(path)

    def dyck_aggregate(self, model: str) -> dict[str, pd.DataFrame]:
        """probes.dyck.case_study over AGGREGATE_PER_COUNT held-out prompts per demonstration
        count (intervals over prompts), once per model."""
        name = self.registry.valid(model)

        def compute() -> dict[str, pd.DataFrame]:
            with self.registry.using(name) as m:
                examples = dyck_prompts(
                    AGGREGATE_PER_COUNT, BATCH_DEMOS, m.cfg.max_seq_len, seed=AGGREGATE_SEED
                )
                return dyck_probe.case_study(dyck_probe.prompt_masses(m, examples), m.schedule)

        return self.tables.get_or_compute(("dyck_aggregate", name), compute)

    @property
    def aggregate_description(self) -> str:
        demos = ", ".join(map(str, BATCH_DEMOS))
        return (
            f"{AGGREGATE_PER_COUNT * len(BATCH_DEMOS)} held-out in-context Dyck prompts "
            f"({AGGREGATE_PER_COUNT} each with {demos} demonstrations)"
        )

    def routing(self, model: str) -> dict[str, pd.DataFrame] | None:
        """probes.routing.tables, or None for a model that is not looped."""
        if not self.registry.cfg(model).is_looped:
            return None
        return self._table("routing", model, routing.tables)

    def similarity(self, model: str) -> pd.DataFrame:
        return self._table("similarity", model, similarity.measure)

    def residual(self, model: str) -> pd.DataFrame:
        return self._table("residual", model, residual.measure)

    @property
    def probe_inputs(self) -> ProbeInputs:
        """The inputs registered probes run on here: the default Dyck batch's demonstration
        counts, 16 rows of held-out Dyck documents of up to 256 tokens."""
        n = self.max_seq_len
        return self.tables.get_or_compute(
            ("probe-inputs", n),
            lambda: ProbeInputs(seq_len=min(256, n), demos=BATCH_DEMOS, max_seq_len=n),
        )

    def probe_tables(self, spec: ProbeSpec) -> dict[str, Tables]:
        """{model: spec.run's tables} for every served model the probe applies to (a
        ProbeError, such as routing on a Baseline, leaves that model out), cached."""

        def compute(name: str) -> Tables:
            with self.registry.using(name) as m:
                return spec.run(m, self.probe_inputs, ProbeOptions())

        out = {}
        for name in self.registry.names:
            try:
                key = (f"probe:{spec.name}", name)
                out[name] = self.tables.get_or_compute(key, lambda name=name: compute(name))
            except ProbeError:
                continue
        return out

    @property
    def batch_description(self) -> str:
        n = BATCH_PER_COUNT * len(BATCH_DEMOS)
        demos = ", ".join(map(str, BATCH_DEMOS))
        return f"{n} held-out in-context Dyck prompts ({demos} demonstrations)"
