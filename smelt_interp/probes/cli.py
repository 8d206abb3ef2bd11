"""The command line every probe shares:

    python -m smelt_interp.probes.<probe> ckpt.pt [--data dyck|code|arith|PATH] [--n-seqs N]
        [--seq-len T] [--demos 0,1,2,4] [--csv OUT] [--json OUT] [--compare OTHER_CKPT]

It loads the checkpoint(s), builds the inputs once, runs the probe on each model, prints the
summary beside the paper's values and the tables, and writes CSV/JSON atomically. Every user
mistake is a SmeltError, which `run_cli` turns into one stderr line and exit code 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from smelt_interp.atomic import atomic_write_text, json_text
from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.cli import ArgumentParser
from smelt_interp.errors import ProbeError
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.output import format_table, records, side_by_side, stack_models, write_csv
from smelt_interp.probes.spec import ProbeOptions, ProbeSpec, Tables

DEFAULT_SEQ_LEN = 256


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
        "(default dyck; the dyck probe uses its own prompts)",
    )
    p.add_argument(
        "--n-seqs", type=_positive, default=16, help="rows of --data; Dyck prompts per demo count"
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
        help="Dyck demonstration counts of the dyck and lens probes' prompts (default 0,1,2,4)",
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


def load_models(paths: Sequence[Path], device: str | None) -> dict[str, SmeltModel]:
    """Checkpoints by a short unique label: the config's name, else the file's stem."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ProbeError(f"unknown --device {device!r}") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ProbeError(f"--device {device}: no CUDA device is available here")
    models = [load_checkpoint(p, device=device)[0] for p in paths]
    labels = [m.cfg.name or Path(p).stem for m, p in zip(models, paths)]
    if len(set(labels)) < len(labels):
        labels = [Path(p).stem for p in paths]
    if len(set(labels)) < len(labels):
        labels = [f"{lab}#{i + 1}" for i, lab in enumerate(labels)]
    return dict(zip(labels, models))


def make_inputs(args: argparse.Namespace, models: dict[str, SmeltModel]) -> ProbeInputs:
    """Inputs fitting every model: --seq-len must not exceed the shortest max_seq_len."""
    limit = min(m.cfg.max_seq_len for m in models.values())
    seq_len = args.seq_len or min(DEFAULT_SEQ_LEN, limit)
    if seq_len > limit:
        raise ProbeError(f"--seq-len {seq_len} exceeds the model's max_seq_len {limit}")
    return ProbeInputs(
        data=args.data,
        n_seqs=args.n_seqs,
        seq_len=seq_len,
        seed=args.seed,
        demos=tuple(args.demos),
        max_seq_len=limit,
    )


def options(args: argparse.Namespace) -> ProbeOptions:
    return ProbeOptions(batch_size=args.batch_size, chunk=args.chunk)


@dataclass
class ProbeResult:
    """A probe's tables stacked over models (`model` column), its summaries side by side, and
    the models it does not apply to, with the reason."""

    tables: Tables
    summary: pd.DataFrame
    skipped: dict[str, str] = field(default_factory=dict)


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
    return ProbeResult(stack_models(per_model), side_by_side(summaries), skipped)


def describe_models(
    models: dict[str, SmeltModel], checkpoints: Mapping[str, Path] | None = None
) -> dict[str, dict]:
    return {
        label: {
            "checkpoint": str((checkpoints or {}).get(label, "")),
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
    paths = [args.checkpoint] + ([args.compare] if args.compare else [])
    models = load_models(paths, args.device)
    inputs = make_inputs(args, models)
    result = run_probe(spec, models, inputs, options(args))
    tables, summary = result.tables, result.summary
    print(f"== {spec.name}: {', '.join(models)} ==")
    print(format_table(summary))
    for name, df in tables.items():
        print(f"\n-- {name} --")
        print(format_table(df))
    if args.csv:
        for path in write_csv(args.csv, tables):
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        payload = {
            "probe": spec.name,
            "models": describe_models(models, dict(zip(models, paths))),
            "summary": records(summary),
            "tables": {n: records(df) for n, df in tables.items()},
        }
        print(f"wrote {atomic_write_text(args.json, json_text(payload))}", file=sys.stderr)
    return 0
