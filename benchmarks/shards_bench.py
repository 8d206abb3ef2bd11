"""Token shards: the loader's rate against what `paper-200m` consumes, `prepare` against the
`tokenizers` library's own batch encoding, and prepare's peak RSS at two corpus sizes.

    python benchmarks/shards_bench.py [--small-mb 4] [--large-mb 40] [--vocab 2048]

The corpus is JSONL of the running interpreter's standard library source (repeated to size).
1. Loader: ShardBatches rows [16, 2048] on one thread, tokens/s, against the tokens/s of
   `paper-200m` on one H200 at 40% MFU (989 TFLOP/s; 3x the forward FLOPs per token, with the
   unembedding). Target: >= 50x.
2. Prepare: `prepare` (BPE) tokens/s against `Tokenizer.encode_batch` alone on the same texts
   and threads, interleaved rounds. Target: within 2x.
3. Memory: peak RSS of `prepare` in a fresh process for the small and the large corpus.
   Target: large within 1.5x of small."""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from smelt_interp.budget import flops_per_token  # noqa: E402
from smelt_interp.data.bpe import train_bpe  # noqa: E402
from smelt_interp.data.prepare import prepare  # noqa: E402
from smelt_interp.data.shards import ShardSet  # noqa: E402
from smelt_interp.data.sources import stdlib_root  # noqa: E402
from smelt_interp.train.config import TrainConfig  # noqa: E402
from smelt_interp.train.presets import get_preset  # noqa: E402
from smelt_interp.train.shard_loader import ShardBatches  # noqa: E402

H200_PEAK = 989e12


def write_corpus(path: Path, megabytes: float) -> list[str]:
    """JSONL of stdlib .py files, repeated until `megabytes`; the texts of its first 2 MB."""
    files = sorted(stdlib_root().rglob("*.py"))
    target, size, sample = int(megabytes * 2**20), 0, []
    with open(path, "w", encoding="utf-8") as fh:
        while size < target:
            for f in files:
                try:
                    text = f.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                fh.write(json.dumps({"text": text}) + "\n")
                size += len(text)
                if sum(map(len, sample)) < 2 << 20:
                    sample.append(text)
                if size >= target:
                    break
    return sample


def peak_rss_mib(args: list[str]) -> float:
    """Peak RSS (MiB) of a fresh `python -m smelt_interp.data` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run(
        [sys.executable, "-m", "smelt_interp.data", *args, "--quiet"],
        check=True,
        capture_output=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(after, before) / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--small-mb", type=float, default=4)
    p.add_argument("--large-mb", type=float, default=40)
    p.add_argument("--vocab", type=int, default=2048)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        small, large = root / "small.jsonl", root / "large.jsonl"
        sample = write_corpus(small, args.small_mb)
        write_corpus(large, args.large_mb)
        tok = train_bpe(iter(sample), args.vocab)
        (root / "tok.json").write_text(tok.json)

        # 2. prepare vs the library's batch encoding, same texts, interleaved rounds
        texts = [json.loads(line)["text"] for line in small.read_text().splitlines()]
        n_tokens = sum(len(ids) + 1 for ids in tok.encode_batch(texts))
        lib, ours = [], []
        for r in range(3):
            t = time.perf_counter()
            tok.encode_batch(texts)
            lib.append(time.perf_counter() - t)
            t = time.perf_counter()
            prepare([str(small)], root / f"p{r}", str(root / "tok.json"))
            ours.append(time.perf_counter() - t)
        lib_s, ours_s = sorted(lib)[1], sorted(ours)[1]
        print(f"prepare ({args.small_mb:g} MB of stdlib source, BPE {args.vocab}, median of 3)")
        print(
            f"  tokenizers encode_batch {n_tokens / lib_s:12,.0f} tokens/s   prepare "
            f"{n_tokens / ours_s:12,.0f} tokens/s   ratio {ours_s / lib_s:.2f}x  (target <= 2x)"
        )

        # 1. the loader on one thread against paper-200m's appetite
        cfg = TrainConfig.from_dict(get_preset("paper-200m"))
        model = cfg.model_config()
        fpt = 3 * flops_per_token(model, cfg.batch.seq_len, include_unembedding=True)
        need = 0.4 * H200_PEAK / fpt
        loader = ShardBatches(ShardSet(root / "p0"), {"text": 1.0}, cfg.batch.seq_len, 16)
        loader.batch(0)
        t, n = time.perf_counter(), 0
        while time.perf_counter() - t < 3.0:
            n += 1
            loader.batch(n)
        rate = n * 16 * cfg.batch.seq_len / (time.perf_counter() - t)
        print(f"loader (rows [16, {cfg.batch.seq_len}], one thread)")
        print(
            f"  {rate:14,.0f} tokens/s   paper-200m at 40% MFU on an H200 needs "
            f"{need:,.0f} tokens/s ({fpt / 1e9:.2f} GFLOP/token trained)   ratio {rate / need:.0f}x"
            f"  (target >= 50x)"
        )

        # 3. prepare's peak RSS, small vs large corpus, each in a fresh process
        rss = {}
        for name, path in (("small", small), ("large", large)):
            out = root / f"rss-{name}"
            rss[name] = peak_rss_mib(
                ["prepare", str(path), "--out", str(out), "--tokenizer", str(root / "tok.json")]
            )
        print("prepare peak RSS (fresh process each)")
        print(
            f"  {args.small_mb:g} MB: {rss['small']:,.0f} MiB   {args.large_mb:g} MB: "
            f"{rss['large']:,.0f} MiB   ratio {rss['large'] / rss['small']:.2f}x  (target <= 1.5x)"
        )


if __name__ == "__main__":
    main()
