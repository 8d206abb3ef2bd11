"""A probing session without a command line, over models opened by smelt_interp.loading: one
set of inputs built for all of them from a typed ProbeRequest (`make_inputs`), and a probe run
on each (`run_probe`), its tables stacked over models and its summaries side by side. The
probes' command line (probes.cli), the report and the dashboard's probe tables
(app.probe_tables) all start here, so the dashboard never reaches through a command-line
module."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from smelt_interp.checkpoint import CheckpointInfo
from smelt_interp.data.bpe import Tokenizer, tokenizer_hash, tokenizer_json
from smelt_interp.errors import ProbeError
from smelt_interp.loading import model_tokenizer
from smelt_interp.model.protocol import LoopedModel
from smelt_interp.probes.inputs import ProbeInputs, ProbeRequest, probe_bytes
from smelt_interp.probes.registry import ProbeOptions, ProbeSpec, Tables
from smelt_interp.provenance import TASK_COMPUTED, TASK_DYCK, TASK_RECALL, Provenance
from smelt_interp.resources import require_memory

DEFAULT_SEQ_LEN = 256


def stack_models(per_model: Mapping[str, Tables]) -> Tables:
    """{model: {table: df}} -> {table: df with a leading `model` column}, tables in
    first-seen order."""
    names: list[str] = []
    for tables in per_model.values():
        names += [n for n in tables if n not in names]
    out: Tables = {}
    for name in names:
        parts = [
            df.assign(model=label)[["model", *df.columns]]
            for label, tables in per_model.items()
            if (df := tables.get(name)) is not None
        ]
        out[name] = pd.concat(parts, ignore_index=True)
    return out


def side_by_side(summaries: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """{model: summary} -> one row per statistic (first-seen order), one column per model,
    then `paper`."""
    order: list[str] = []
    paper: dict[str, str] = {}
    values: dict[str, dict[str, float]] = {}
    for label, df in summaries.items():
        for stat, value, ref in zip(df["statistic"], df["value"], df["paper"]):
            if stat not in order:
                order.append(stat)
            paper[stat] = paper.get(stat) or ref
            values.setdefault(label, {})[stat] = value
    out = pd.DataFrame({"statistic": order})
    for label in summaries:
        out[label] = [values.get(label, {}).get(stat, float("nan")) for stat in order]
    out["paper"] = [paper[stat] for stat in order]
    return out


def shared_tokenizer(infos: Mapping[str, CheckpointInfo]) -> Tokenizer:
    """The tokenizer every checkpoint carries (checked against its hash); checkpoints of
    different tokenizers cannot share one set of inputs, so they are refused in one line."""
    tokenizers = {label: model_tokenizer(info) for label, info in infos.items()}
    hashes = {label: tokenizer_hash(tokenizer_json(t)) for label, t in tokenizers.items()}
    if len(set(hashes.values())) > 1:
        shown = ", ".join(f"{label} {h[:12]}" for label, h in hashes.items())
        raise ProbeError(f"the checkpoints carry different tokenizers ({shown}); probe each alone")
    return next(iter(tokenizers.values()))


def make_inputs(
    request: ProbeRequest, models: Mapping[str, LoopedModel], infos: Mapping[str, CheckpointInfo]
) -> ProbeInputs:
    """Inputs fitting every model: --seq-len must not exceed the shortest max_seq_len. Dyck
    words follow the Dyck spec of the first checkpoint trained on Dyck, and associative-recall
    rows the recall spec of the first trained on recall (each task's held-out distribution as
    its own models saw it; the first checkpoint's where none was), so a recall model served
    beside a Dyck pair does not change the Dyck pair's words. The case study's default task is
    the first checkpoint's. The command line and the dashboard both call this."""
    limit = min(m.cfg.max_seq_len for m in models.values())
    seq_len = request.seq_len or min(DEFAULT_SEQ_LEN, limit)
    if seq_len > limit:
        raise ProbeError(f"--seq-len {seq_len} exceeds the model's max_seq_len {limit}")
    cfgs = [m.cfg for m in models.values()]
    tokenizer = shared_tokenizer(infos)
    provenances = [Provenance.of(info) for info in infos.values()]
    first = provenances[0]
    dyck_source = next((p for p in provenances if p.task == TASK_DYCK), first)
    recall_source = next((p for p in provenances if p.task == TASK_RECALL), first)
    computed_source = next((p for p in provenances if p.trained_on(TASK_COMPUTED)), None)
    require_memory(
        probe_bytes(cfgs, request.n_seqs, seq_len, len(request.demos), request.batch_size),
        f"--n-seqs {request.n_seqs} x --seq-len {seq_len} (batch {request.batch_size})",
    )
    return ProbeInputs(
        data=request.data,
        n_seqs=request.n_seqs,
        seq_len=seq_len,
        seed=request.seed,
        demos=tuple(request.demos),
        max_seq_len=limit,
        dyck=dyck_source.dyck_spec,
        assoc_recall=recall_source.recall_spec,
        computed_recall=(computed_source or first).computed_spec,
        computed_row_len=computed_source.row_len(TASK_COMPUTED) if computed_source else None,
        task=request.task,
        trained_task=first.task,
        draw=request.draw,
        tokenizer=tokenizer,
        prompt=request.prompt,
        prompt_ids=request.prompt_ids,
    )


def options(request: ProbeRequest) -> ProbeOptions:
    return ProbeOptions(batch_size=request.batch_size, chunk=request.chunk)


@dataclass
class ProbeResult:
    """A probe's tables stacked over models (`model` column), its summaries side by side, the
    models it does not apply to, with the reason, and each model's own tables as `run`
    returned them (what smelt_interp.figures.probes draws)."""

    tables: Tables
    summary: pd.DataFrame
    skipped: dict[str, str] = field(default_factory=dict)
    per_model: dict[str, Tables] = field(default_factory=dict)


def run_probe(
    spec: ProbeSpec,
    models: dict[str, LoopedModel],
    inputs: ProbeInputs,
    opts: ProbeOptions,
    *,
    skip_inapplicable: bool = False,
) -> ProbeResult:
    """Run `spec` on every model. A ProbeError (e.g. routing on a Baseline) propagates, or with
    skip_inapplicable is recorded in `skipped` while the other models go on."""
    per_model: dict[str, Tables] = {}
    skipped: dict[str, str] = {}
    for label, model in models.items():
        try:
            per_model[label] = spec.run(model, inputs, opts)
        except ProbeError as exc:
            if not skip_inapplicable:
                raise
            skipped[label] = str(exc)
    summaries = {label: spec.summarize(tables) for label, tables in per_model.items()}
    return ProbeResult(stack_models(per_model), side_by_side(summaries), skipped, per_model)
