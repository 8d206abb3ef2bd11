"""What the server holds between requests: the served models (ModelRegistry) and the caches of
what was computed from them, as data (Served), with the facts about the served models that the
pages share as plain functions. The computations that fill the caches live where their job is:
one prompt's forward pass in app.prompt_run, a page's default prompt in app.default_prompts, the
registered probes' tables in app.probe_tables, a case-study view's example in its page module.

The server answers each request in its own thread. Threads share the caches (app.lru.LRU): a key
is computed once while other threads asking for it wait, other keys compute meanwhile, and a hit
never waits; a model runs one forward pass at a time (ModelRegistry.using), different models at
once. Cache keys carry the model's version (ModelRegistry.version), so a checkpoint replaced
while the app runs is computed afresh, never served from the old one's entries."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from smelt_interp.app.lru import CACHE_SIZE, LRU
from smelt_interp.app.registry import ModelRegistry
from smelt_interp.data.prompt_text import ids_only
from smelt_interp.probes.inputs import ProbeRequest
from smelt_interp.provenance import Provenance
from smelt_interp.train.sink_eval import sink_history

TABLES_SIZE = 64  # (probe, model, inputs) entries
INPUTS_SIZE = 4  # distinct probe inputs (each holds its token batches)


@dataclass
class Served:
    """The app's server-side state: the models, what the probes run on (`probe_request`, as the
    report's flags would say) and one LRU per kind of result."""

    registry: ModelRegistry
    cache_size: int = CACHE_SIZE
    probe_request: ProbeRequest = field(default_factory=ProbeRequest)
    prompts: LRU = field(init=False)  # (model, version, prompt) -> PromptRun
    dyck: LRU = field(init=False)  # (model, version, text) -> DyckCase
    table_cache: LRU = field(init=False)  # (probe, model, version, inputs) -> Tables | None
    inputs: LRU = field(init=False)  # inputs_key -> ProbeInputs
    recall_rows: LRU = field(init=False)  # (model, version, row) -> RecallExample
    default_prompts: LRU = field(init=False)  # (model, version) -> its default prompt
    tokenizer_keys: LRU = field(init=False)  # (model, version) -> its tokenizer's hash

    def __post_init__(self) -> None:
        self.prompts = LRU(self.cache_size)
        self.dyck = LRU(self.cache_size)
        self.table_cache = LRU(maxsize=TABLES_SIZE)
        self.inputs = LRU(maxsize=INPUTS_SIZE)
        self.recall_rows = LRU(self.cache_size)
        self.default_prompts = LRU(self.cache_size)
        self.tokenizer_keys = LRU(self.cache_size)


def text_models(served: Served) -> list[str]:
    """The served models that read text: every one but a model folder without a tokenizer, to
    which no text prompt (a Dyck example, a recall row) can be posed."""
    registry = served.registry
    return [n for n in registry.names if not ids_only(registry.tokenizer(n))]


def shortest_context(served: Served) -> int:
    """The shortest context among the loaded models."""
    return min(m.cfg.max_seq_len for m in served.registry.models.values())


def provenance_of(served: Served, model: str) -> Provenance:
    """What `model` was trained on and where its run folder is (a run still training, not
    loaded yet, has its path and no training config)."""
    registry = served.registry
    loaded = model in registry.names
    return Provenance(registry.paths[model], registry.info(model).train_config if loaded else None)


def metrics_path(served: Served, model: str) -> Path:
    """The metrics.jsonl of a served run, ready or still training (it may not exist; a model
    given in memory has a name, not a file, and no run folder)."""
    return provenance_of(served, model).metrics_file


def sink_training(served: Served, model: str) -> pd.DataFrame:
    """The sink over training from the metrics.jsonl beside the model's checkpoint (read each
    time: a run may still be writing it); empty when there is none."""
    return sink_history(metrics_path(served, served.registry.valid(model)))
