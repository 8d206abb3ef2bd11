"""The server-side work behind the pages, cached: one forward pass per (model, prompt) whose
activations (post-RoPE Q/K of every visit, the router's picks) sit in an LRU so changing a
head, visit or token never reruns the model; each registered probe's tables as its spec.run
returns them on the report's default inputs, once per (probe, model, inputs), so a dashboard
figure and the report's table come from the same numbers; the Dyck case study per (model,
prompt); the held-out associative-recall row the case-study page shows, with its position sets.
Everything here calls the model, the probes and the data package; nothing here draws or imports
Dash.

The server answers each request in its own thread. Threads share the caches: a key is computed
once while other threads asking for it wait, other keys compute meanwhile, and a hit never
waits; a model runs one forward pass at a time (ModelRegistry.using), different models at
once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from smelt_interp.app.default_prompts import default_prompt
from smelt_interp.app.lru import CACHE_SIZE, LRU
from smelt_interp.app.registry import ModelRegistry
from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_positions, recall_rows
from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.dyck import DyckExample, DyckSpec, build_example, dyck_max_len, make_dataset
from smelt_interp.data.dyck_tokens import encode_example
from smelt_interp.data.tokenizer import ByteTokenizer
from smelt_interp.errors import (
    DataError,
    ProbeError,
    PromptError,
    TokenError,
    TokenizerError,
)
from smelt_interp.measure.attention_stats import pattern
from smelt_interp.measure.dyck_score import complete
from smelt_interp.measure.provenance import TASK_RECALL, Provenance
from smelt_interp.measure.sink import pattern_bos_share
from smelt_interp.model.transformer import hook_name
from smelt_interp.probes import case_study as case_probe
from smelt_interp.probes.common import capture
from smelt_interp.probes.inputs import RECALL_ROWS, ProbeInputs, ProbeRequest
from smelt_interp.probes.registry import ProbeOptions, ProbeSpec, Tables, get
from smelt_interp.probes.session import make_inputs
from smelt_interp.train.case_eval import case_history
from smelt_interp.train.sink_eval import sink_history

TOKENIZER = ByteTokenizer()
DEFAULT_DYCK = {"pairs": 4, "depth": 4, "demos": 2, "seed": 0}


# ----- prompts ------------------------------------------------------------------------------
def display_labels(ids: list[int], tokenizer: Tokenizer = TOKENIZER) -> list[str]:
    """The tokenizer's labels (the model's own: a BPE model's tokens decoded) with newline and
    tab drawn as visible symbols."""
    shown = {"\\x0a": "⏎", "\\x09": "⇥"}
    return [
        shown.get(label, label).replace("\n", "⏎").replace("\t", "⇥")
        for label in tokenizer.token_labels(ids)
    ]


def encode_prompt(
    text: str | None, max_seq_len: int, tokenizer: Tokenizer = TOKENIZER
) -> list[int]:
    """BOS + the prompt's tokens, or PromptError with a message for the page."""
    if text is None or not str(text).strip():
        raise PromptError("The prompt is empty: type some text and press Run.")
    try:
        ids = tokenizer.encode(str(text))
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
    # per layer that hides keys (ModelConfig.hidden_key_ids), its hidden keys [1, T]
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
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
                rows = pattern(self.q[key], self.k[key], hidden=self.hidden.get(layer))
                self._patterns[key] = rows[0].cpu().numpy()
        return self._patterns[key]

    def bos_share(self, layer: int, visit: int) -> np.ndarray:
        """Per head, the mean attention of queries 1.. on BOS: [H]."""
        return pattern_bos_share(self.pattern(layer, visit))

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
    tokenizer = registry.tokenizer(model_name)
    ids = encode_prompt(prompt, model.cfg.max_seq_len, tokenizer)
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
    tokens = torch.tensor([ids], dtype=torch.long)
    try:
        with registry.using(model_name):
            logits, cache = capture(model, tokens, names)
    except TokenError as exc:
        raise PromptError(f"{exc}. Edit the prompt and run again.") from None
    get = lambda lv, h: cache[hook_name(*lv, h)].detach().cpu()  # noqa: E731
    return PromptRun(
        model=model_name,
        prompt=prompt,
        ids=ids,
        labels=display_labels(ids, tokenizer),
        schedule=schedule,
        q={lv: get(lv, "attn.hook_q") for lv in schedule},
        k={lv: get(lv, "attn.hook_k") for lv in schedule},
        expert_indices=np.stack([get(lv, "moe.hook_expert_indices")[0].numpy() for lv in schedule]),
        expert_weights=np.stack(
            [get(lv, "moe.hook_expert_weights")[0].float().numpy() for lv in schedule]
        ),
        next_token=display_labels(logits[0].argmax(-1).tolist(), tokenizer),
        hidden={layer: h.cpu() for layer, h in model.hidden_keys(tokens).items()},
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


def dyck_example(
    text: str | None, max_seq_len: int, tokenizer: Tokenizer | None = None
) -> DyckExample:
    """The Dyck prompt of the page's text in `tokenizer`'s tokens (default bytes; a BPE
    model's prompt and spans through data.dyck_tokens); PromptError when it is not one or does
    not fit."""
    query, demos = parse_dyck_lines(text)
    try:
        ex = encode_example(build_example(query, demos), tokenizer or ByteTokenizer())
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
    visits: pd.DataFrame  # probes.case_study.by_visit of this one example
    heads: pd.DataFrame | None = None  # its per-head rows (probes.case_study.measure)


def run_dyck(registry: ModelRegistry, model_name: str, text: str) -> DyckCase:
    tokenizer = registry.tokenizer(model_name)
    ex = dyck_example(text, registry.cfg(model_name).max_seq_len, tokenizer)
    with registry.using(model_name) as model:
        try:
            answer = complete(model, ex.query, demos=ex.demos, tokenizer=tokenizer)
        except (DataError, TokenizerError) as exc:
            raise PromptError(str(exc)) from None
        measured = case_probe.measure(model, [ex])
    visits = case_probe.by_visit(measured)
    return DyckCase(model_name, ex, answer, answer == ex.answer, visits, measured)


# ----- the associative-recall example -------------------------------------------------------
@dataclass(frozen=True)
class RecallExample:
    """One held-out associative-recall row as the case-study page shows it: `ids` (BOS first),
    `labels` (triggers as T0, T1, ...), `text` (the row after BOS, for Workbench.run), the
    position sets of data.assoc_recall (`answer`, `first` query positions; `demos`: answer
    position -> the positions of its demonstration answers) and `targets` (the token each
    query predicts)."""

    index: int
    ids: list[int]
    labels: list[str]
    text: str
    answer: list[int]
    first: list[int]
    demos: dict[int, list[int]]
    targets: list[int]
    trigger_ids: tuple[int, ...]


def recall_example(index: int, spec: AssocRecallSpec, length: int) -> RecallExample:
    """Held-out row `index` (data.assoc_recall.recall_rows, split "heldout", seed `index`)."""
    row = recall_rows(1, length, seed=index, split="heldout", spec=spec)
    sets = recall_positions(row, spec.trigger_ids)
    ids = row[0].tolist()
    names = {t: f"T{i}" for i, t in enumerate(spec.trigger_ids)}
    answer = sets.answer[0].nonzero().flatten().tolist()
    return RecallExample(
        index=index,
        ids=ids,
        labels=[names.get(i, label) for i, label in zip(ids, display_labels(ids))],
        text=bytes(ids[1:]).decode("latin-1"),
        answer=answer,
        first=sets.first[0].nonzero().flatten().tolist(),
        demos={q: sets.demos[0, q].nonzero().flatten().tolist() for q in answer},
        targets=sets.targets[0].tolist(),
        trigger_ids=spec.trigger_ids,
    )


# ----- everything together ------------------------------------------------------------------
class Workbench:
    """The app's server-side state: the models, the per-prompt LRU, the Dyck LRU and the
    registered probes' tables."""

    def __init__(
        self,
        registry: ModelRegistry,
        cache_size: int = CACHE_SIZE,
        probe_request: ProbeRequest | None = None,
    ) -> None:
        self.registry = registry
        self.prompts = LRU(cache_size)
        self.dyck = LRU(cache_size)
        # what the probes run on, as the report's flags would say
        self.probe_request = probe_request or ProbeRequest()
        self.table_cache = LRU(maxsize=64)
        self.inputs = LRU(maxsize=4)
        self.recall_rows = LRU(cache_size)  # (model, version, row) -> RecallExample
        self.default_prompts = LRU(cache_size)  # (model, version) -> its default prompt

    # per (model, prompt)
    # Cache keys carry the model's version (ModelRegistry.version), so a checkpoint replaced
    # while the app runs is computed afresh, never served from the old one's entries.
    def run(self, model: str, prompt: str) -> PromptRun:
        model = self.registry.valid(model)
        key = (model, self.registry.version(model), prompt)
        return self.prompts.get_or_compute(key, lambda: run_prompt(self.registry, model, prompt))

    def default_prompt(self, model: str | None) -> str:
        """The prompt a page opens on for `model` (the default model when None or not served):
        a held-out example of its own task that fits its context (app.default_prompts)."""
        name = self.registry.valid(model)
        return self.default_prompts.get_or_compute(
            (name, self.registry.version(name)),
            lambda: default_prompt(
                self.provenance(name),
                self.registry.cfg(name).max_seq_len,
                self.registry.tokenizer(name),
            ),
        )

    def context_note(self, model: str | None) -> str:
        """Where a prompt is typed: how many tokens `model` reads."""
        name = self.registry.valid(model)
        n = self.registry.cfg(name).max_seq_len
        return f"{name} reads at most {n} tokens, BOS included."

    def prompt_labels(self, model: str | None, prompt: str | None) -> list[str]:
        """The token labels run(model, prompt) would show, from the tokenizer alone (no forward
        pass: what a page lays out before its figures arrive); PromptError as run raises it."""
        model = self.registry.valid(model)
        tokenizer = self.registry.tokenizer(model)
        ids = encode_prompt(prompt, self.registry.cfg(model).max_seq_len, tokenizer)
        return display_labels(ids, tokenizer)

    def dyck_case(self, model: str, text: str) -> DyckCase:
        key = (model, self.registry.version(model), text)
        return self.dyck.get_or_compute(key, lambda: run_dyck(self.registry, model, text))

    @property
    def max_seq_len(self) -> int:
        return min(m.cfg.max_seq_len for m in self.registry.models.values())

    # the registered probes, through spec.run on the report's inputs
    @property
    def probe_inputs(self) -> ProbeInputs:
        """The inputs `python -m smelt_interp.report CKPT` probes the served models on (the
        same make_inputs on the same typed request): by default 16 rows of up to 256 tokens of
        held-out Dyck documents and 16 held-out in-context Dyck prompts per demonstration
        count. One instance per distinct inputs, so its batch is built once."""
        return self.inputs_for()

    def task_request(self, task: str) -> ProbeRequest:
        """probe_request with the case study's task set (a page's own choice)."""
        return replace(self.probe_request, task=task)

    def own_task_request(self, model: str) -> ProbeRequest:
        """probe_request on the rows of the task `model` trained on: held-out recall rows for a
        recall checkpoint, probe_request's data otherwise."""
        if self.provenance(model).task == TASK_RECALL:
            return replace(self.probe_request, data=RECALL_ROWS)
        return self.probe_request

    def inputs_for(
        self, request: ProbeRequest | None = None, models: Sequence[str] | None = None
    ) -> ProbeInputs:
        """make_inputs of `request` (default probe_request) for `models` (default every served
        model; the specs and default task are the first one's)."""
        names = self.registry.names if models is None else list(models)
        inputs = make_inputs(
            request or self.probe_request,
            {n: self.registry.get(n) for n in names},
            {n: self.registry.info(n) for n in names},
        )
        return self.inputs.get_or_compute(inputs_key(inputs), lambda: inputs)

    def tables(
        self, probe: str | ProbeSpec, model: str, request: ProbeRequest | None = None
    ) -> Tables | None:
        """spec.run's tables of `probe` on `model` over inputs_for(request) (default: the
        report's probe_inputs), cached per (probe, model, inputs), with the model held while it
        runs; None where the probe does not apply (a ProbeError, such as routing on a
        Baseline). A request on RECALL_ROWS is built from `model`'s own checkpoint, so the rows
        follow its recall spec."""
        spec = probe if isinstance(probe, ProbeSpec) else get(probe)
        name = self.registry.valid(model)
        own = request is not None and request.data == RECALL_ROWS
        inputs = self.inputs_for(request, [name] if own else None)

        def compute() -> Tables | None:
            with self.registry.using(name) as m:
                try:
                    return spec.run(m, inputs, ProbeOptions())
                except ProbeError:
                    return None

        key = (spec.name, name, self.registry.version(name), inputs_key(inputs))
        return self.table_cache.get_or_compute(key, compute)

    def probe_tables(
        self, spec: ProbeSpec, request: ProbeRequest | None = None
    ) -> dict[str, Tables]:
        """{model: spec.run's tables} for every served model the probe applies to."""
        found = {name: self.tables(spec, name, request) for name in self.registry.names}
        return {name: tables for name, tables in found.items() if tables is not None}

    def own_task_tables(self, spec: ProbeSpec) -> dict[str, Tables]:
        """probe_tables with each model measured on its own task's rows (own_task_request)."""
        found = {n: self.tables(spec, n, self.own_task_request(n)) for n in self.registry.names}
        return {name: tables for name, tables in found.items() if tables is not None}

    def provenance(self, model: str) -> Provenance:
        """What `model` was trained on and where its run folder is (a run still training, not
        loaded yet, has its path and no training config)."""
        path = self.registry.paths[model]
        loaded = model in self.registry.names
        return Provenance(path, self.registry.info(model).train_config if loaded else None)

    def sink_training(self, model: str) -> pd.DataFrame:
        """The sink over training from the metrics.jsonl beside the model's checkpoint (read
        each time: a run may still be writing it); empty when there is none."""
        return sink_history(self.metrics_path(self.registry.valid(model)))

    def recall_example(self, model: str, index: int) -> RecallExample:
        """Held-out assoc_recall row `index` on the task spec and row length `model` trained on
        (a CheckpointError for a recall checkpoint that records no spec)."""
        name = self.registry.valid(model)

        def build() -> RecallExample:
            provenance = self.provenance(name)
            trained = provenance.row_len(TASK_RECALL) or self.max_seq_len
            length = max(2, min(trained, self.max_seq_len))
            return recall_example(index, provenance.recall_spec, length)

        # the row's draw is shared by concurrent requests for it and kept for the next
        key = (name, self.registry.version(name), index)
        return self.recall_rows.get_or_compute(key, build)

    def metrics_path(self, model: str) -> Path:
        """The metrics.jsonl of a served run, ready or still training (it may not exist; a model
        given in memory has a name, not a file, and no run folder)."""
        return self.provenance(model).metrics_file

    def case_training(self, model: str) -> pd.DataFrame:
        """The trainer's case-study evaluations from the model's metrics.jsonl as
        train.case_eval's long table (read each time: a run may still be writing it)."""
        return case_history(self.metrics_path(model))

    @property
    def batch_description(self) -> str:
        """What the probes' token rows are, for the pages' subtitles."""
        i = self.probe_inputs
        return f"{i.n_seqs} rows of up to {i.seq_len} tokens of held-out {i.data} documents"

    @property
    def prompts_description(self) -> str:
        """What the probes' in-context Dyck prompts are, for the pages' subtitles."""
        i = self.probe_inputs
        demos = ", ".join(map(str, i.demos))
        return (
            f"{i.n_seqs * len(i.demos)} held-out in-context Dyck prompts "
            f"({i.n_seqs} each with {demos} demonstrations)"
        )


def inputs_key(inputs: ProbeInputs) -> tuple:
    """The fields that say what `inputs` holds (not its lazily built batches): a cache key."""
    return tuple(getattr(inputs, f.name) for f in fields(inputs) if not f.name.startswith("_"))
