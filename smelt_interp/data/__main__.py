"""`python -m smelt_interp.data prepare SOURCE... --out DIR --tokenizer T` (also `smelt-prepare`):
text files, folders, JSONL and Parquet into token shards (data.prepare, data.shards), with a
progress bar and the rates at the end. Run again after an interruption, it resumes by shard."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from smelt_interp.cli import ArgumentParser, int_at_least, run_cli
from smelt_interp.data.prepare import DEFAULT_SHARD_TOKENS, Source, prepare, source_bytes


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
    p.add_argument(
        "--tokenizer",
        default="bytes",
        help="bytes, bpe:VOCAB_SIZE (trained on the sources) or a tokenizer.json (default bytes)",
    )
    p.add_argument(
        "--shard-tokens",
        type=int_at_least(1),
        default=DEFAULT_SHARD_TOKENS,
        help=f"tokens a shard holds at most, about (default {DEFAULT_SHARD_TOKENS})",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def prepare_main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from tqdm import tqdm

    total = source_bytes([Source.parse(s) for s in args.sources])
    with tqdm(
        total=total, unit="B", unit_scale=True, disable=args.quiet, desc="prepare", file=sys.stderr
    ) as bar:
        tokens = 0

        def progress(n_bytes: int, n_tokens: int) -> None:
            nonlocal tokens
            tokens += n_tokens
            bar.update(n_bytes)
            bar.set_postfix(tokens=f"{tokens:,}", refresh=False)

        stats = prepare(
            args.sources,
            args.out,
            args.tokenizer,
            shard_tokens=args.shard_tokens,
            progress=progress,
        )
    if stats.docs == 0 and stats.shards == 0:
        print(f"{args.out}: already prepared")
        return 0
    print(
        f"{args.out}: {stats.docs:,} documents, {stats.tokens:,} tokens in {stats.shards} shards "
        f"({stats.seconds:.1f} s, {stats.tokens_per_s:,.0f} tokens/s, "
        f"{stats.bytes / max(stats.seconds, 1e-9) / 2**20:,.1f} MiB/s)"
        + (f"; {stats.skipped_docs:,} documents already in shards" if stats.skipped_docs else "")
    )
    for name, per in sorted(stats.by_domain.items()):
        print(f"  {name}: {per['docs']:,} documents, {per['tokens']:,} tokens")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return prepare_main(argv)


if __name__ == "__main__":
    run_cli(main)
