"""The registered probes' tables for the served models, as the report computes them: spec.run on
the report's inputs (probes.session.make_inputs on the same typed request), once per (probe,
model, inputs), so a dashboard figure and the report's table come from the same numbers. The
served models are grouped by tokenizer (make_inputs refuses models of different tokenizers); a
model without a tokenizer is probed on its default row of ids. No Dash here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace

from smelt_interp.app.default_prompts import default_ids
from smelt_interp.app.served import Served, provenance_of
from smelt_interp.data.bpe import tokenizer_hash, tokenizer_json
from smelt_interp.data.prompt_text import ids_only
from smelt_interp.errors import ProbeError, TokenizerError
from smelt_interp.probes.inputs import RECALL_ROWS, ProbeInputs, ProbeRequest
from smelt_interp.probes.registry import ProbeOptions, ProbeSpec, Tables, get
from smelt_interp.probes.session import make_inputs
from smelt_interp.provenance import TASK_RECALL


def inputs_key(inputs: ProbeInputs) -> tuple:
    """The fields that say what `inputs` holds (not its lazily built batches): a cache key."""
    return tuple(getattr(inputs, f.name) for f in fields(inputs) if not f.name.startswith("_"))


def tokenizer_key(served: Served, name: str) -> str:
    """The hash of `name`'s tokenizer, kept per model version (a BPE record is large)."""
    registry = served.registry
    return served.tokenizer_keys.get_or_compute(
        (name, registry.version(name)),
        lambda: tokenizer_hash(tokenizer_json(registry.tokenizer(name))),
    )


def tokenizer_groups(served: Served) -> list[list[str]]:
    """The served models grouped by tokenizer, in serving order: the models of one group can
    share one set of inputs."""
    groups: dict[str, list[str]] = {}
    for name in served.registry.names:
        groups.setdefault(tokenizer_key(served, name), []).append(name)
    return list(groups.values())


def peers(served: Served, name: str) -> list[str]:
    """The served models that share `name`'s tokenizer (itself among them)."""
    return next(g for g in tokenizer_groups(served) if name in g)


def request_for(served: Served, name: str, request: ProbeRequest) -> ProbeRequest:
    """`request` as `name` can be probed on: a model without a tokenizer reads no text, so its
    probes run on its default row of ids (default_ids), the row its pages open on."""
    if not ids_only(served.registry.tokenizer(name)):
        return request
    cfg = served.registry.cfg(name)
    return replace(request, prompt_ids=tuple(default_ids(cfg.vocab_size, cfg.max_seq_len)))


def task_request(served: Served, task: str) -> ProbeRequest:
    """probe_request with the case study's task set (a page's own choice)."""
    return replace(served.probe_request, task=task)


def own_task_request(served: Served, model: str) -> ProbeRequest:
    """probe_request on the rows of the task `model` trained on: held-out recall rows for a
    recall checkpoint, probe_request's data otherwise."""
    if provenance_of(served, model).task == TASK_RECALL:
        return replace(served.probe_request, data=RECALL_ROWS)
    return served.probe_request


def inputs_for(
    served: Served, request: ProbeRequest | None = None, models: Sequence[str] | None = None
) -> ProbeInputs:
    """make_inputs of `request` (default probe_request) for `models` (default every served
    model; the specs and default task are the first one's), one instance per distinct inputs so
    its batch is built once."""
    registry = served.registry
    names = registry.names if models is None else list(models)
    inputs = make_inputs(
        request or served.probe_request,
        {n: registry.get(n) for n in names},
        {n: registry.info(n) for n in names},
    )
    return served.inputs.get_or_compute(inputs_key(inputs), lambda: inputs)


def probe_inputs(served: Served) -> ProbeInputs:
    """The inputs `python -m smelt_interp.report CKPT` probes the served models on: by default 16
    rows of up to 256 tokens of held-out Dyck documents and 16 held-out in-context Dyck prompts
    per demonstration count. Where the served models do not share one tokenizer, the inputs of
    the first group that reads text."""
    groups = tokenizer_groups(served)
    tokenizer = served.registry.tokenizer
    first = next((g for g in groups if not ids_only(tokenizer(g[0]))), groups[0])
    return inputs_for(served, request_for(served, first[0], served.probe_request), first)


def model_tables(
    served: Served, probe: str | ProbeSpec, model: str, request: ProbeRequest | None = None
) -> Tables | None:
    """spec.run's tables of `probe` on `model` over inputs_for(request) (default: the report's
    probe_inputs), cached per (probe, model, inputs), with the model held while it runs; None
    where the probe does not apply (a ProbeError, such as routing on a Baseline). A request on
    RECALL_ROWS is built from `model`'s own checkpoint, so the rows follow its recall spec."""
    spec = probe if isinstance(probe, ProbeSpec) else get(probe)
    registry = served.registry
    name = registry.valid(model)
    own = request is not None and request.data == RECALL_ROWS
    # the models sharing its tokenizer share its inputs (all of them, where all share one)
    asked = request_for(served, name, request or served.probe_request)
    inputs = inputs_for(served, asked, [name] if own else peers(served, name))

    def compute() -> Tables | None:
        with registry.using(name) as m:
            try:
                return spec.run(m, inputs, ProbeOptions())
            except (ProbeError, TokenizerError):
                # not applicable: routing on a Baseline, or on a model folder without a
                # tokenizer a probe whose prompts are text (the case study)
                return None

    key = (spec.name, name, registry.version(name), inputs_key(inputs))
    return served.table_cache.get_or_compute(key, compute)


def probe_tables(
    served: Served, spec: ProbeSpec, request: ProbeRequest | None = None
) -> dict[str, Tables]:
    """{model: spec.run's tables} for every served model the probe applies to."""
    found = {name: model_tables(served, spec, name, request) for name in served.registry.names}
    return {name: found_tables for name, found_tables in found.items() if found_tables is not None}


def own_task_tables(served: Served, spec: ProbeSpec) -> dict[str, Tables]:
    """probe_tables with each model measured on its own task's rows (own_task_request)."""
    found = {
        n: model_tables(served, spec, n, own_task_request(served, n)) for n in served.registry.names
    }
    return {name: found_tables for name, found_tables in found.items() if found_tables is not None}


def batch_description(served: Served) -> str:
    """What the probes' token rows are, for the pages' subtitles: each tokenizer group's, named
    by its models where the served models do not share one (a model without a tokenizer reads
    its default row of ids)."""
    groups = tokenizer_groups(served)
    parts = []
    for group in groups:
        if ids_only(served.registry.tokenizer(group[0])):
            cfg = served.registry.cfg(group[0])
            n = len(default_ids(cfg.vocab_size, cfg.max_seq_len))
            text = f"one row of {n} token ids (no tokenizer)"
        else:
            i = inputs_for(served, served.probe_request, group)
            text = f"{i.n_seqs} rows of up to {i.seq_len} tokens of held-out {i.data} documents"
        parts.append(text if len(groups) == 1 else f"{text} for {', '.join(group)}")
    return "; ".join(parts)


def prompts_description(served: Served) -> str:
    """What the probes' in-context Dyck prompts are, for the pages' subtitles."""
    i = probe_inputs(served)
    demos = ", ".join(map(str, i.demos))
    return (
        f"{i.n_seqs * len(i.demos)} held-out in-context Dyck prompts "
        f"({i.n_seqs} each with {demos} demonstrations)"
    )
