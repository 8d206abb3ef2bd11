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
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pandas as pd

from smelt_interp.app.default_prompts import default_ids, default_prompt
from smelt_interp.app.lru import CACHE_SIZE, LRU
from smelt_interp.app.prompt_run import (
    PromptRun,
    display_labels,
    encode_prompt,
    ids_only,
    run_prompt,
)
from smelt_interp.app.registry import ModelRegistry
from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_positions, recall_rows
from smelt_interp.data.bpe import Tokenizer, tokenizer_hash, tokenizer_json
from smelt_interp.data.dyck import DyckExample, DyckSpec, build_example, dyck_max_len, make_dataset
from smelt_interp.data.dyck_tokens import encode_example
from smelt_interp.data.tokenizer import ByteTokenizer
from smelt_interp.errors import DataError, ProbeError, PromptError, TokenizerError
from smelt_interp.measure.dyck_score import complete
from smelt_interp.measure.provenance import TASK_RECALL, Provenance
from smelt_interp.probes import case_study as case_probe
from smelt_interp.probes.inputs import RECALL_ROWS, ProbeInputs, ProbeRequest
from smelt_interp.probes.registry import ProbeOptions, ProbeSpec, Tables, get
from smelt_interp.probes.session import make_inputs
from smelt_interp.train.case_eval import case_history
from smelt_interp.train.sink_eval import sink_history

DEFAULT_DYCK = {"pairs": 4, "depth": 4, "demos": 2, "seed": 0}


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
        self.tokenizer_keys = LRU(cache_size)  # (model, version) -> its tokenizer's hash

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
                self.registry.cfg(name).vocab_size,
                getattr(self.registry.cfg(name), "arch", None),
            ),
        )

    def context_note(self, model: str | None) -> str:
        """Where a prompt is typed: how many tokens `model` reads (and, for a model without a
        tokenizer, that its prompt is a row of ids)."""
        name = self.registry.valid(model)
        cfg = self.registry.cfg(name)
        if ids_only(self.registry.tokenizer(name)):
            return (
                f"{name} has no tokenizer: give its row as token ids, 'ids: 1,17,42' (ids "
                f"0..{cfg.vocab_size - 1}, at most {cfg.max_seq_len})."
            )
        return f"{name} reads at most {cfg.max_seq_len} tokens, BOS included."

    def prompt_labels(self, model: str | None, prompt: str | None) -> list[str]:
        """The token labels run(model, prompt) would show, from the tokenizer alone (no forward
        pass: what a page lays out before its figures arrive); PromptError as run raises it."""
        model = self.registry.valid(model)
        tokenizer, cfg = self.registry.tokenizer(model), self.registry.cfg(model)
        ids = encode_prompt(prompt, cfg.max_seq_len, tokenizer, cfg.vocab_size)
        return display_labels(ids, tokenizer)

    def text_models(self) -> list[str]:
        """The served models that read text: every one but a model folder without a
        tokenizer, to which no text prompt (a Dyck example, a recall row) can be posed."""
        return [n for n in self.registry.names if not ids_only(self.registry.tokenizer(n))]

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
        count. One instance per distinct inputs, so its batch is built once. Where the served
        models do not share one tokenizer, the inputs of the first group that reads text."""
        groups = self.tokenizer_groups()
        first = next((g for g in groups if not ids_only(self.registry.tokenizer(g[0]))), groups[0])
        return self.inputs_for(self.request_for(first[0], self.probe_request), first)

    def tokenizer_groups(self) -> list[list[str]]:
        """The served models grouped by tokenizer, in serving order: the models of one group
        can share one set of inputs (make_inputs refuses models of different tokenizers)."""
        groups: dict[str, list[str]] = {}
        for name in self.registry.names:
            groups.setdefault(self.tokenizer_key(name), []).append(name)
        return list(groups.values())

    def tokenizer_key(self, name: str) -> str:
        """The hash of `name`'s tokenizer, kept per model version (a BPE record is large)."""
        key = (name, self.registry.version(name))
        return self.tokenizer_keys.get_or_compute(
            key, lambda: tokenizer_hash(tokenizer_json(self.registry.tokenizer(name)))
        )

    def peers(self, name: str) -> list[str]:
        """The served models that share `name`'s tokenizer (itself among them)."""
        return next(g for g in self.tokenizer_groups() if name in g)

    def request_for(self, name: str, request: ProbeRequest) -> ProbeRequest:
        """`request` as `name` can be probed on: a model without a tokenizer reads no text, so
        its probes run on its default row of ids (default_ids), the row its pages open on."""
        if not ids_only(self.registry.tokenizer(name)):
            return request
        cfg = self.registry.cfg(name)
        return replace(request, prompt_ids=tuple(default_ids(cfg.vocab_size, cfg.max_seq_len)))

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
        # the models sharing its tokenizer share its inputs (all of them, where all share one)
        asked = self.request_for(name, request or self.probe_request)
        inputs = self.inputs_for(asked, [name] if own else self.peers(name))

        def compute() -> Tables | None:
            with self.registry.using(name) as m:
                try:
                    return spec.run(m, inputs, ProbeOptions())
                except (ProbeError, TokenizerError):
                    # not applicable: routing on a Baseline, or on a model folder without a
                    # tokenizer a probe whose prompts are text (the case study)
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
        """What the probes' token rows are, for the pages' subtitles: each tokenizer group's,
        named by its models where the served models do not share one (a model without a
        tokenizer reads its default row of ids)."""
        groups = self.tokenizer_groups()
        parts = []
        for group in groups:
            if ids_only(self.registry.tokenizer(group[0])):
                cfg = self.registry.cfg(group[0])
                n = len(default_ids(cfg.vocab_size, cfg.max_seq_len))
                text = f"one row of {n} token ids (no tokenizer)"
            else:
                i = self.inputs_for(self.probe_request, group)
                text = f"{i.n_seqs} rows of up to {i.seq_len} tokens of held-out {i.data} documents"
            parts.append(text if len(groups) == 1 else f"{text} for {', '.join(group)}")
        return "; ".join(parts)

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
