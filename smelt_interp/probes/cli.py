"""The command line every probe shares:

    python -m smelt_interp.probes.<probe> ckpt.pt|MODEL_FOLDER [--data dyck|code|arith|PATH]
        [--prompt TEXT | --prompt-ids 1,17,42] [--n-seqs N] [--seq-len T] [--demos 0,1,2,4]
        [--draw test|validation] [--csv OUT] [--json OUT] [--compare OTHER_CKPT]

It loads the checkpoint(s) or local transformers folders of looped models (smelt_interp.adapters),
builds the inputs once, runs the probe on each model, prints the
summary beside the paper's values and the tables, and writes CSV/JSON atomically (a temp file
renamed into place, so a failure never leaves a half-written or clobbered file). Every user
mistake is a SmeltError, which `run_cli` turns into one stderr line and exit code 2. A probe
module's `if __name__ == "__main__":` guard is its entry point: it calls `run_probe_command`,
which runs `probe_main` on that module's own spec, as `python -m smelt_interp.probes NAME` runs
it on the registered one; smelt_interp.report uses the same loading, running and formatting for
every registered probe at once. Text is encoded and token labels decoded with the checkpoints'
own tokenizer (`checkpoint_tokenizer`: BPE when the file carries one, else bytes); a checkpoint
whose tokenizer does not match its hash, or two checkpoints of different tokenizers, is one
line. Loading, inputs and running are probes.session's: the dashboard builds the same typed
ProbeRequest that `request_from_args` builds from the flags, and calls the same `make_inputs`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd

from smelt_interp.adapters.inference_loop import split_loop_name
from smelt_interp.checkpoint import CheckpointInfo
from smelt_interp.cli import ArgumentParser, run_cli
from smelt_interp.data.dyck_draws import DRAWS, TEST
from smelt_interp.data.sources import source_path
from smelt_interp.files import atomic_write_many, check_outputs, json_text
from smelt_interp.loading import load_models
from smelt_interp.model.protocol import LoopedModel
from smelt_interp.probes.inputs import ProbeInputs, ProbeRequest
from smelt_interp.probes.registry import ProbeOptions, ProbeSpec, Tables
from smelt_interp.probes.session import DEFAULT_SEQ_LEN, make_inputs, options, run_probe
from smelt_interp.provenance import TASKS

MAX_LIST_INT = 2**31  # a token id or a count in a list flag: past any vocabulary or count
MAX_INT_DIGITS = 12  # parsed only below this many digits (int() refuses 4,300 with a traceback)


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
    checkpoint, compare = (
        split_loop_name(p)[0] if p is not None else None for p in (args.checkpoint, args.compare)
    )
    return {"CHECKPOINT": checkpoint, "--compare": compare, "--data": data}


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


def _int_list(what: str, example: str) -> Callable[[str], tuple[int, ...]]:
    """A parser of comma-separated integers >= 0 (`what` and `example` name them in errors)."""

    def parse(text: str) -> tuple[int, ...]:
        shown = text if len(text) <= 60 else text[:57] + "..."
        parts = [v.strip() for v in text.split(",") if v.strip()]
        if any(len(v.lstrip("+-")) > MAX_INT_DIGITS for v in parts):  # int() of 5,000 digits
            raise argparse.ArgumentTypeError(
                f"expected {what} below {MAX_LIST_INT:,} like {example}, got {shown!r}"
            )
        try:
            values = tuple(int(v) for v in parts)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {what} like {example}, got {shown!r}"
            ) from None
        if not values or min(values) < 0:
            raise argparse.ArgumentTypeError(f"expected {what} >= 0 like {example}, got {shown!r}")
        if max(values) >= MAX_LIST_INT:  # a token id or a count: torch holds neither past int64
            raise argparse.ArgumentTypeError(
                f"expected {what} below {MAX_LIST_INT:,} like {example}, got {shown!r}"
            )
        return values

    return parse


def _add_row_flags(p: ArgumentParser) -> None:
    """What the probes read: --data or one prompt, its size, the Dyck prompts and the seed."""
    p.add_argument(
        "--data",
        default="dyck",
        help="rows to probe: dyck, code, arith (held-out documents), a prepared shards folder "
        "(its held-out rows) or a PATH of text/JSONL (default dyck; the case_study probe uses "
        "its task's own rows)",
    )
    p.add_argument(
        "--prompt",
        metavar="TEXT",
        help="probe one row of this text instead of --data (encoded with the checkpoint's "
        "tokenizer)",
    )
    p.add_argument(
        "--prompt-ids",
        type=_int_list("token ids", "1,17,42"),
        metavar="IDS",
        help="probe one row given as token ids (1,17,42,...), as it is: no BOS is added; for "
        "any model, with or without a tokenizer",
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
        type=_int_list("counts", "0,1,2,4"),
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


def _add_run_flags(p: ArgumentParser) -> None:
    """How the model runs: batch, attention chunk, device and remote code."""
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
    p.add_argument(
        "--loop",
        metavar="START:END[xR]",
        default=None,
        help="run CHECKPOINT's layers START..END-1 R times (default 2) at inference, untrained, "
        "e.g. 12:18x2 (a transformers folder of a dense model: llama, mistral); --compare may "
        "name its own as FOLDER@START:END[xR]",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let a model folder run the modeling file it ships (its architecture must still "
        "be one the adapter knows; see smelt_interp.adapters.register_arch)",
    )


def build_parser(prog: str, description: str, *, csv: bool = True) -> ArgumentParser:
    """The shared flags (a probe that ignores some still accepts them)."""
    p = ArgumentParser(prog=prog, description=description)
    p.add_argument(
        "checkpoint",
        type=Path,
        help="ckpt.pt to probe, or a local transformers folder of a looped model "
        "(hrm_text, dory, inkling2_loop) or a dense one (llama, mistral; FOLDER@START:END[xR] "
        "loops it at inference, as --loop does)",
    )
    p.add_argument(
        "--compare",
        type=Path,
        metavar="OTHER_CKPT",
        help="a second checkpoint or model folder, side by side",
    )
    _add_row_flags(p)
    _add_run_flags(p)
    if csv:
        p.add_argument(
            "--csv",
            type=Path,
            metavar="OUT",
            help="write the main table here (other tables beside it)",
        )
    p.add_argument("--json", type=Path, metavar="OUT", help="write summary and all tables as JSON")
    return p


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
        prompt_ids=getattr(args, "prompt_ids", None),
    )


def token_record(inputs: ProbeInputs) -> dict[str, list] | None:
    """The first probed row's ids and their labels in the models' tokenizer (what the numbers
    were measured on, readable); None when the probes read no `batch` rows."""
    if not inputs.has_batch:
        return None
    tokens, lengths = inputs.batch()
    ids = tokens[0, : int(lengths[0])].tolist()
    return {"ids": ids, "labels": inputs.tokenizer.token_labels(ids)}


def config_record(cfg: Any) -> dict[str, Any]:
    """A model's shape as JSON: a ModelConfig's saved fields, or an adapted model's shape."""
    if hasattr(cfg, "to_dict"):
        return cfg.to_dict()
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def describe_models(
    models: dict[str, LoopedModel], infos: Mapping[str, CheckpointInfo] | None = None
) -> dict[str, dict]:
    return {
        label: {
            "checkpoint": str(infos[label].path) if infos else "",
            "config": config_record(m.cfg),
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
    models, infos = load_models(paths, args.device, args.trust_remote_code, args.loop)
    request = request_from_args(args)
    inputs = make_inputs(request, models, infos)
    result = run_probe(spec, models, inputs, options(request))
    tables, summary = result.tables, result.summary
    print(f"== {spec.name}: {', '.join(models)} ==")
    if request.prompt is not None or request.prompt_ids is not None:
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
