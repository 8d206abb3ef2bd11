"""`python -m smelt_interp.data prepare SOURCE... --out DIR --tokenizer T` (also `smelt-prepare`):
text files, folders, JSONL and Parquet into token shards (data.prepare, data.shards), with a
progress bar and the rates at the end. Run again after an interruption, it resumes by shard.

`python -m smelt_interp.data gather --out STAGE [--shards DIR --tokenizer T]`: the text this
machine holds (Python source, docs, headers; data.local_text) staged as JSONL, then, with
`--shards`, prepared into token shards the same way as `prepare`."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smelt_interp.cli import ArgumentParser, int_at_least, run_cli
from smelt_interp.data.local_text import DEFAULT_MAX_BYTES, GatherStats, gather
from smelt_interp.data.prepare import (
    DEFAULT_SHARD_TOKENS,
    Manifest,
    PrepareStats,
    Source,
    prepare,
    source_bytes,
)
from smelt_interp.errors import ConfigError
from smelt_interp.files import atomic_write_text, check_outputs, json_text

_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*([kmgt]?)(i?b)?", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """An argparse `type`: a byte count, `1000000`, `200k`, `512M`, `2G`, `1.5GiB` (binary)."""
    match = _SIZE.fullmatch(text.strip())
    value = 0.0
    if match:
        value = float(match.group(1)) * 1024 ** " kmgt".index(match.group(2).lower() or " ")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a byte count >= 1 such as 200k or 2G: {text!r}")
    return int(value)


def _tokenizer_flags(p: argparse.ArgumentParser, default: str | None, note: str = "") -> None:
    p.add_argument(
        "--tokenizer",
        default=default,
        help=f"bytes, bpe:VOCAB_SIZE (trained on the sources) or a tokenizer.json{note} "
        f"(default bytes)",
    )
    p.add_argument(
        "--shard-tokens",
        type=int_at_least(1),
        default=None if default is None else DEFAULT_SHARD_TOKENS,
        help=f"tokens a shard holds at most, about (default {DEFAULT_SHARD_TOKENS})",
    )


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m smelt_interp.data", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prepare", help="text sources into token shards")
    p.add_argument(
        "sources",
        nargs="+",
        metavar="SOURCE",
        help="a text file, folder, JSONL or Parquet file, optionally DOMAIN=PATH",
    )
    p.add_argument("--out", required=True, help="the folder of shards (new, or one to resume)")
    _tokenizer_flags(p, "bytes")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    g = commands.add_parser(
        "gather",
        help="the text this machine holds (Python source, docs, headers) as a corpus",
        description="Stage the Python source, docs and headers this machine holds as JSONL "
        "(see smelt_interp.data.local_text), then optionally prepare token shards of it. "
        "The tokenizer's threads use every core; RAYON_NUM_THREADS bounds them.",
    )
    g.add_argument(
        "--out",
        required=True,
        metavar="STAGE",
        help="the staging folder: new, or one holding this gather",
    )
    g.add_argument(
        "--root",
        action="append",
        metavar="DOMAIN=PATH",
        help="read this folder instead of the default roots (repeatable); docs, python and "
        "headers take their suffixes, another domain every text suffix",
    )
    g.add_argument(
        "--max-bytes",
        type=parse_bytes,
        metavar="N",
        default=DEFAULT_MAX_BYTES,
        help="text to gather at most, shared fairly by the domains (e.g. 512M; default 1G)",
    )
    g.add_argument(
        "--workers",
        type=int_at_least(1),
        help="processes that read files (default: every core)",
    )
    g.add_argument("--shards", metavar="DIR", help="then prepare token shards of it here")
    _tokenizer_flags(g, None, ", with --shards")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--json", metavar="PATH", help="also write what was done here, as JSON")
    return parser


def run_prepare(
    sources: Sequence[str], out: str, tokenizer: str, shard_tokens: int, quiet: bool
) -> PrepareStats:
    """prepare() under a progress bar on stderr (its total: the sources' bytes)."""
    from tqdm import tqdm

    total = source_bytes([Source.parse(s) for s in sources])
    with tqdm(
        total=total, unit="B", unit_scale=True, disable=quiet, desc="prepare", file=sys.stderr
    ) as bar:
        tokens = 0

        def progress(n_bytes: int, n_tokens: int) -> None:
            nonlocal tokens
            tokens += n_tokens
            bar.update(n_bytes)
            bar.set_postfix(tokens=f"{tokens:,}", refresh=False)

        return prepare(sources, out, tokenizer, shard_tokens=shard_tokens, progress=progress)


def print_prepared(out: str, stats: PrepareStats, splits: bool = True) -> None:
    """The summary line of a prepare call (and its documents and tokens by domain/split)."""
    if stats.docs == 0 and stats.shards == 0:
        print(f"{out}: already prepared")
        return
    print(
        f"{out}: {stats.docs:,} documents, {stats.tokens:,} tokens in {stats.shards} shards "
        f"({stats.seconds:.1f} s, {stats.tokens_per_s:,.0f} tokens/s, "
        f"{stats.bytes / max(stats.seconds, 1e-9) / 2**20:,.1f} MiB/s)"
        + (f"; {stats.skipped_docs:,} documents already in shards" if stats.skipped_docs else "")
    )
    for name, per in sorted(stats.by_domain.items()) if splits else ():
        print(f"  {name}: {per['docs']:,} documents, {per['tokens']:,} tokens")


def _prepare_command(args: argparse.Namespace) -> int:
    stats = run_prepare(args.sources, args.out, args.tokenizer, args.shard_tokens, args.quiet)
    print_prepared(args.out, stats)
    return 0


def _print_gathered(stats: GatherStats) -> None:
    mib = stats.bytes / 2**20
    if stats.reused:
        print(f"{stats.out}: already gathered ({stats.documents:,} documents, {mib:,.1f} MiB)")
    else:
        print(
            f"{stats.out}: {stats.documents:,} documents, {mib:,.1f} MiB gathered "
            f"({stats.seconds:.1f} s, {mib / max(stats.seconds, 1e-9):,.1f} MiB/s)"
        )
    for name, d in sorted(stats.domains.items()):
        skipped = sum(d.skipped.values())
        print(
            f"  {name}: {d.documents:,} documents, {d.bytes / 2**20:,.1f} MiB"
            f" ({skipped:,} of {d.files:,} files listed skipped"
            + ("; budget reached)" if d.budget_reached else ")")
        )


def _domain_tokens(shards: str) -> dict[str, int]:
    """Tokens by domain (train and held-out together) over a prepared folder's shards: from its
    manifest, so a resumed or already finished preparation counts every shard."""
    manifest = Manifest.read(Path(shards))
    tokens: dict[str, int] = {}
    for shard in manifest.shards if manifest is not None else ():
        tokens[shard["domain"]] = tokens.get(shard["domain"], 0) + shard["tokens"]
    return tokens


def _gather_command(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    check_outputs({"--out": args.out, "--shards": args.shards}, {"--json": args.json})
    if args.shards is not None and Path(args.shards).resolve() == Path(args.out).resolve():
        raise ConfigError(f"--shards {args.shards} is --out; the shards need a folder of their own")
    bar: Any = None

    def progress(n_bytes: int) -> None:  # a bar from the first document kept: none on an error
        nonlocal bar
        if bar is None:
            bar = tqdm(
                total=args.max_bytes,
                unit="B",
                unit_scale=True,
                disable=args.quiet,
                desc="gather",
                file=sys.stderr,
            )
        bar.update(n_bytes)

    try:
        stats = gather(
            args.out, args.root, max_bytes=args.max_bytes, workers=args.workers, progress=progress
        )
    finally:
        if bar is not None:
            bar.close()
    _print_gathered(stats)
    record: dict[str, Any] = {
        "domains": {
            d: {"documents": s.documents, "bytes": s.bytes, "skipped": s.skipped}
            for d, s in sorted(stats.domains.items())
        },
        "documents": stats.documents,
        "bytes": stats.bytes,
        "gather_seconds": stats.seconds,
        "roots": stats.roots,
        "tokenizer": None,
        "prepare_seconds": None,
        "unique_tokens": None,
    }
    if args.shards is not None:
        shard_tokens = args.shard_tokens or DEFAULT_SHARD_TOKENS
        start = time.perf_counter()  # tokenizer training included
        prepared = run_prepare(
            stats.sources(), args.shards, args.tokenizer or "bytes", shard_tokens, args.quiet
        )
        print_prepared(args.shards, prepared, splits=False)
        tokens = _domain_tokens(args.shards)
        for name, d in sorted(stats.domains.items()):
            n = record["domains"][name]["tokens"] = tokens.get(name, 0)
            print(f"  {name}: {d.documents:,} documents, {d.bytes:,} bytes, {n:,} tokens")
        record["unique_tokens"] = sum(tokens.values())
        record["tokenizer"] = args.tokenizer or "bytes"
        record["prepare_seconds"] = time.perf_counter() - start
        print(f"unique tokens: {record['unique_tokens']:,} (each document once)")
    if args.json is not None:
        atomic_write_text(args.json, json_text(record))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "gather" and args.shards is None:
        if args.tokenizer is not None or args.shard_tokens is not None:
            parser.error("gather: --tokenizer and --shard-tokens need --shards DIR")
    return {"prepare": _prepare_command, "gather": _gather_command}[args.command](args)


prepare_main = main  # the old name of main, when prepare was the only command


if __name__ == "__main__":
    run_cli(main)
