"""`python -m smelt_interp.analysis.downstream BASELINE.pt SMELT.pt [--data SOURCES | --shards DIR]
[--plot OUT.html] [--json OUT]` (or `smelt-downstream`): compare a Baseline and a SMELT
checkpoint, print the three tables and write them as JSON and figures (plotly only when --plot
asks for it). `--shards DIR` scores the held-out documents of a prepared folder's domains (of
the pair's tokenizer); the built-in sources are byte text, so a BPE pair needs `--shards`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import pandas as pd

from smelt_interp.analysis.downstream.compare import (
    BYTES_PER_RESAMPLE,
    SECONDS_PER_RESAMPLE,
    DownstreamReport,
    compare,
    compare_bytes,
)
from smelt_interp.analysis.downstream.shards import compare_shards
from smelt_interp.analysis.resampling import check_resamples
from smelt_interp.checkpoint import CheckpointInfo, load_checkpoint
from smelt_interp.cli import ArgumentParser, int_at_least, run_cli
from smelt_interp.data.bpe import Tokenizer, checkpoint_tokenizer, tokenizer_hash, tokenizer_json
from smelt_interp.data.shards import ShardSet
from smelt_interp.data.sources import source_path
from smelt_interp.data.tokenizer import ByteTokenizer
from smelt_interp.errors import DataError
from smelt_interp.files import atomic_write_many, check_outputs, json_text
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.resources import require_memory

DEFAULT_SOURCES = "code,arith,dyck"


def pair_tokenizer(base: CheckpointInfo, smelt: CheckpointInfo) -> Tokenizer:
    """The tokenizer both checkpoints carry; a pair of two tokenizers is one DataError line."""
    tokenizers = [checkpoint_tokenizer(info.meta) for info in (base, smelt)]
    if len({tokenizer_hash(tokenizer_json(t)) for t in tokenizers}) > 1:
        raise DataError("BASELINE and SMELT carry different tokenizers; compare a matched pair")
    return tokenizers[0]


def _parser() -> ArgumentParser:
    """downstream_main's flags."""
    p = ArgumentParser(
        prog="python -m smelt_interp.analysis.downstream",
        description="Loss gain of SMELT over Baseline by domain, length and demonstrations.",
    )
    p.add_argument("baseline")
    p.add_argument("smelt")
    p.add_argument(
        "--data", help=f"comma-separated sources or paths (default {DEFAULT_SOURCES}; byte text)"
    )
    p.add_argument(
        "--shards",
        metavar="DIR",
        help="instead of --data, the held-out documents of a prepared folder's domains",
    )
    p.add_argument("--n-docs", type=int_at_least(1), default=64)
    p.add_argument("--n-dyck", type=int_at_least(1), default=200)
    p.add_argument("--bootstrap", type=int_at_least(0), default=200)
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--json", help="write the three tables as JSON")
    p.add_argument("--plot", help="write the figures as one HTML page")
    return p


def _score(
    args: argparse.Namespace,
    base: SmeltModel,
    smelt: SmeltModel,
    tokenizer: Tokenizer,
    sources: list[str],
) -> DownstreamReport:
    """The pair's comparison on the held-out shards of --shards, else on the byte sources."""
    if args.shards:
        shards = ShardSet(args.shards, expect_hash=tokenizer_hash(tokenizer_json(tokenizer)))
        return compare_shards(
            base,
            smelt,
            shards,
            tokenizer,
            n_docs=args.n_docs,
            n_dyck=args.n_dyck,
            n_boot=args.bootstrap,
            seed=args.seed,
        )
    if not isinstance(tokenizer, ByteTokenizer):
        raise DataError(
            "the pair's tokenizer is BPE and --data sources are read as bytes; "
            "score a prepared folder of its tokenizer with --shards DIR"
        )
    return compare(
        base,
        smelt,
        sources,
        n_docs=args.n_docs,
        n_dyck=args.n_dyck,
        n_boot=args.bootstrap,
        seed=args.seed,
    )


def _print_tables(report: DownstreamReport) -> None:
    """The three tables, each under its title (an empty one says why)."""
    pd.set_option("display.width", 160)
    for title, table in (
        ("gain by domain (1 - CE_smelt / CE_baseline)", report.by_domain),
        ("gain by " + report.length_key.replace("_", " ") + " (tokens)", report.by_length),
        ("Dyck exact match by in-context examples", report.by_demos),
    ):
        if table.empty:
            print(f"\n{title}: none (Dyck prompts are spelled in bytes; this pair reads BPE)")
            continue
        print(f"\n{title}\n{table.to_string(index=False, float_format=lambda x: f'{x:.4f}')}")


def downstream_main(argv: Sequence[str] | None = None) -> int:
    """Compare a Baseline and a SMELT checkpoint; print the three tables, write JSON/HTML."""
    p = _parser()
    args = p.parse_args(argv)
    check_resamples(args.bootstrap, SECONDS_PER_RESAMPLE, BYTES_PER_RESAMPLE, "--bootstrap")
    if args.shards and args.data:
        p.error("--data and --shards: give one of them")
    sources = [s for s in (args.data or DEFAULT_SOURCES).split(",") if s]
    paths = {f"--data {s}": source_path(s) for s in sources} if not args.shards else {}
    inputs = {"BASELINE": args.baseline, "SMELT": args.smelt, **paths}
    inputs |= {"--shards": args.shards} if args.shards else {}
    check_outputs(inputs, {"--json": args.json, "--plot": args.plot})
    (base, base_info), (smelt, smelt_info) = (
        load_checkpoint(c) for c in (args.baseline, args.smelt)
    )
    tokenizer = pair_tokenizer(base_info, smelt_info)
    longest = max(base.cfg.max_seq_len, smelt.cfg.max_seq_len)
    n_sources = len(ShardSet(args.shards).domains("heldout")) if args.shards else len(sources)
    require_memory(
        compare_bytes(longest, n_sources, args.n_docs, args.n_dyck),
        f"--n-docs {args.n_docs} and --n-dyck {args.n_dyck}",
    )
    report = _score(args, base, smelt, tokenizer, sources)
    _print_tables(report)
    texts = {args.json: json_text(report.to_json(), indent=2)} if args.json else {}
    if args.plot:
        from smelt_interp.figures.downstream import report_html

        texts[args.plot] = report_html(report)
    atomic_write_many(texts)  # all or none
    return 0


if __name__ == "__main__":
    run_cli(downstream_main)
