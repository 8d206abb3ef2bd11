"""The command line every probe shares:

    python -m smelt_interp.probes.<probe> ckpt.pt [--data dyck|code|arith|PATH] [--prompt TEXT]
        [--n-seqs N] [--seq-len T] [--demos 0,1,2,4] [--draw test|validation] [--csv OUT]
        [--json OUT] [--compare OTHER_CKPT]

It loads the checkpoint(s), builds the inputs once, runs the probe on each model, prints the
summary beside the paper's values and the tables, and writes CSV/JSON atomically (a temp file
renamed into place, so a failure never leaves a half-written or clobbered file). Every user
mistake is a SmeltError, which `run_cli` turns into one stderr line and exit code 2. A probe
module's `if __name__ == "__main__":` guard is its entry point: it calls `run_probe_command`,
which runs `probe_main` on that module's own spec, as `python -m smelt_interp.probes NAME` runs
it on the registered one; smelt_interp.report uses the same loading, running and formatting for
every registered probe at once. Text is encoded and token labels decoded with the checkpoints'
own tokenizer (`checkpoint_tokenizer`: BPE when the file carries one, else bytes); a checkpoint
whose tokenizer does not match its hash, or two checkpoints of different tokenizers, is one
line. The dashboard builds the same typed ProbeRequest that
`request_from_args` builds from the flags, and calls the same `make_inputs`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd

from smelt_interp.checkpoint import CheckpointInfo, load_checkpoint
from smelt_interp.cli import ArgumentParser, parse_device, require_memory, run_cli
from smelt_interp.data.bpe import Tokenizer, checkpoint_tokenizer, tokenizer_hash, tokenizer_json
from smelt_interp.data.dyck import DRAWS, TEST
from smelt_interp.data.sources import source_path
from smelt_interp.errors import ProbeError
from smelt_interp.files import atomic_write_many, check_outputs, json_text
from smelt_interp.measure.provenance import TASK_DYCK, TASK_RECALL, TASKS, Provenance
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes.inputs import ProbeInputs, ProbeRequest, probe_bytes
from smelt_interp.probes.registry import ProbeOptions, ProbeSpec, Tables

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


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON-ready rows: numpy scalars to Python, NaN and inf to null."""
    return json.loads(df.to_json(orient="records", double_precision=10))


def csv_paths(path: str | os.PathLike[str], names: list[str]) -> dict[str, Path]:
    """The main table goes to `path`; each further table to `<stem>.<name><suffix>` beside it."""
    path = Path(path)
    suffix = path.suffix or ".csv"
    return {
        name: path if i == 0 else path.with_name(f"{path.stem}.{name}{suffix}")
        for i, name in enumerate(names)
    }


def csv_texts(path: str | os.PathLike[str], tables: Tables) -> dict[Path, str]:
    """{file: CSV text} of every table, named as `csv_paths` names them."""
    return {
        p: tables[name].to_csv(index=False) for name, p in csv_paths(path, list(tables)).items()
    }


def input_paths(args: argparse.Namespace) -> dict[str, Path | None]:
    """The files a probe command reads, by the argument that names them (for check_outputs)."""
    data = source_path(args.data)
    return {"CHECKPOINT": args.checkpoint, "--compare": args.compare, "--data": data}


def output_paths(args: argparse.Namespace, tables: Sequence[str]) -> dict[str, Path | None]:
    """The files a probe command writes: --json and, with --csv, one file per table."""
    csv = getattr(args, "csv", None)
    named = csv_paths(csv, list(tables)) if csv else {}
    return {
        "--json": args.json,
        **{
            ("--csv" if i == 0 else f"--csv ({name})"): p
            for i, (name, p) in enumerate(named.items())
        },
    }


def format_table(df: pd.DataFrame, max_rows: int = 60) -> str:
    """A readable fixed-width table (4 significant decimals, long tables cut in the middle)."""
    if df.empty:
        return "(empty)"
    return df.to_string(index=False, max_rows=max_rows, float_format=lambda v: f"{v:.4f}")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _demos(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 0,1,2,4, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected counts >= 0 like 0,1,2,4, got {text!r}")
    return values


def build_parser(prog: str, description: str, *, csv: bool = True) -> ArgumentParser:
    """The shared flags (a probe that ignores some still accepts them)."""
    p = ArgumentParser(prog=prog, description=description)
    p.add_argument("checkpoint", type=Path, help="ckpt.pt to probe")
    p.add_argument(
        "--compare", type=Path, metavar="OTHER_CKPT", help="a second checkpoint, side by side"
    )
    p.add_argument(
        "--data",
        default="dyck",
        help="rows to probe: dyck, code, arith (held-out documents) or a PATH of text/JSONL "
        "(default dyck; the case_study probe uses its task's own rows)",
    )
    p.add_argument(
        "--prompt",
        metavar="TEXT",
        help="probe one row of this text instead of --data (encoded with the checkpoint's "
        "tokenizer)",
    )
    p.add_argument(
        "--n-seqs",
        type=_positive,
        default=16,
        help="rows of --data and associative-recall rows; Dyck prompts per demo count",
    )
    p.add_argument(
        "--seq-len",
        type=_positive,
        default=None,
        help=f"tokens per row (default min({DEFAULT_SEQ_LEN}, the model's max_seq_len))",
    )
    p.add_argument(
        "--demos",
        type=_demos,
        default=(0, 1, 2, 4),
        help="Dyck demonstration counts of the case_study and lens probes' prompts "
        "(default 0,1,2,4)",
    )
    p.add_argument(
        "--task",
        choices=TASKS,
        default=None,
        help="the case study's task (default: assoc_recall when the checkpoint trained on it, "
        "else dyck)",
    )
    p.add_argument(
        "--draw",
        choices=DRAWS,
        default=TEST,
        help="the held-out draw Dyck prompts come from: test (default; for reporting) or "
        "validation (the words a recipe is chosen on)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--batch-size",
        type=_positive,
        default=ProbeOptions.batch_size,
        help="rows per forward pass",
    )
    p.add_argument(
        "--chunk", type=_positive, default=ProbeOptions.chunk, help="queries per attention chunk"
    )
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when available)")
    if csv:
        p.add_argument(
            "--csv",
            type=Path,
            metavar="OUT",
            help="write the main table here (other tables beside it)",
        )
    p.add_argument("--json", type=Path, metavar="OUT", help="write summary and all tables as JSON")
    return p


def load_models(
    paths: Sequence[Path], device: str | None
) -> tuple[dict[str, SmeltModel], dict[str, CheckpointInfo]]:
    """Checkpoints by a short unique label (the config's name, else the file's stem), and what
    else each file held, by the same labels."""
    target = parse_device(device)
    loaded = [load_checkpoint(p, device=target) for p in paths]
    labels = [m.cfg.name or Path(p).stem for (m, _), p in zip(loaded, paths)]
    if len(set(labels)) < len(labels):
        labels = [Path(p).stem for p in paths]
    if len(set(labels)) < len(labels):
        labels = [f"{lab}#{i + 1}" for i, lab in enumerate(labels)]
    models = {label: model for label, (model, _) in zip(labels, loaded)}
    return models, {label: info for label, (_, info) in zip(labels, loaded)}


def request_from_args(args: argparse.Namespace) -> ProbeRequest:
    """The typed request the parsed flags of build_parser's parser ask for."""
    return ProbeRequest(
        data=args.data,
        n_seqs=args.n_seqs,
        seq_len=args.seq_len,
        demos=tuple(args.demos),
        task=getattr(args, "task", None),
        seed=args.seed,
        draw=args.draw,
        batch_size=args.batch_size,
        chunk=args.chunk,
        prompt=getattr(args, "prompt", None),
    )


def shared_tokenizer(infos: Mapping[str, CheckpointInfo]) -> Tokenizer:
    """The tokenizer every checkpoint carries (checked against its hash); checkpoints of
    different tokenizers cannot share one set of inputs, so they are refused in one line."""
    tokenizers = {label: checkpoint_tokenizer(info.meta) for label, info in infos.items()}
    hashes = {label: tokenizer_hash(tokenizer_json(t)) for label, t in tokenizers.items()}
    if len(set(hashes.values())) > 1:
        shown = ", ".join(f"{label} {h[:12]}" for label, h in hashes.items())
        raise ProbeError(f"the checkpoints carry different tokenizers ({shown}); probe each alone")
    return next(iter(tokenizers.values()))


def make_inputs(
    request: ProbeRequest, models: Mapping[str, SmeltModel], infos: Mapping[str, CheckpointInfo]
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
        task=request.task,
        trained_task=first.task,
        draw=request.draw,
        tokenizer=tokenizer,
        prompt=request.prompt,
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
    models: dict[str, SmeltModel],
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


def token_record(inputs: ProbeInputs) -> dict[str, list] | None:
    """The first probed row's ids and their labels in the models' tokenizer (what the numbers
    were measured on, readable); None when the probes read no `batch` rows."""
    if not inputs.has_batch:
        return None
    tokens, lengths = inputs.batch()
    ids = tokens[0, : int(lengths[0])].tolist()
    return {"ids": ids, "labels": inputs.tokenizer.token_labels(ids)}


def describe_models(
    models: dict[str, SmeltModel], infos: Mapping[str, CheckpointInfo] | None = None
) -> dict[str, dict]:
    return {
        label: {
            "checkpoint": str(infos[label].path) if infos else "",
            "config": m.cfg.to_dict(),
            "schedule": [list(lv) for lv in m.schedule],
        }
        for label, m in models.items()
    }


def probe_main(spec: ProbeSpec, argv: Sequence[str] | None = None) -> int:
    """The whole command for one probe."""
    args = build_parser(f"python -m smelt_interp.probes.{spec.name}", spec.description).parse_args(
        argv
    )
    check_outputs(input_paths(args), output_paths(args, spec.tables))
    paths = [args.checkpoint] + ([args.compare] if args.compare else [])
    models, infos = load_models(paths, args.device)
    request = request_from_args(args)
    inputs = make_inputs(request, models, infos)
    result = run_probe(spec, models, inputs, options(request))
    tables, summary = result.tables, result.summary
    print(f"== {spec.name}: {', '.join(models)} ==")
    if request.prompt is not None:
        print("tokens: " + " ".join(inputs.token_labels()))
    print(format_table(summary))
    for name, df in tables.items():
        print(f"\n-- {name} --")
        print(format_table(df))
    texts = csv_texts(args.csv, tables) if args.csv else {}
    if args.json:
        payload = {
            "probe": spec.name,
            "models": describe_models(models, infos),
            "summary": records(summary),
            "tables": {n: records(df) for n, df in tables.items()},
            "tokens": token_record(inputs),
        }
        texts[args.json] = json_text(payload)
    check_outputs(input_paths(args), output_paths(args, list(tables)))
    for path in atomic_write_many(texts):
        print(f"wrote {path}", file=sys.stderr)
    return 0


def run_probe_command(spec: ProbeSpec) -> NoReturn:
    """What a probe module's `if __name__ == "__main__":` guard calls: `python -m
    smelt_interp.probes.<name> ARGS` runs probe_main on the module's own spec, errors as one
    line and exit code 2."""
    run_cli(lambda argv: probe_main(spec, argv))
