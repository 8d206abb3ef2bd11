"""Token shards: the loader's rate against what `paper-200m` consumes, `prepare` against the
`tokenizers` library's own batch encoding, and the peak RSS of preparing, of loading and of
training at two corpus sizes.

    python benchmarks/shards_bench.py [--small-mb 4] [--large-mb 40] [--vocab 2048]
        [--tokenizer bpe|bytes] [--memory-only | --rates-only] [--stages prepare,loader,training]

The corpus is JSONL of the running interpreter's standard library source (repeated to size).
1. Loader: ShardBatches rows [16, 2048] on one thread, tokens/s, against the tokens/s of
   `paper-200m` on one H200 at 40% MFU (989 TFLOP/s; 3x the forward FLOPs per token, with the
   unembedding). Target: >= 50x.
2. Prepare: `prepare` (BPE) tokens/s against `Tokenizer.encode_batch` alone on the same texts
   and threads, interleaved rounds. Target: within 2x.
3. Memory: peak RSS in a fresh process for the small and the large corpus, side by side: of
   `prepare`; of the loader alone (ShardBatches over the prepared folder, LOADER_BATCHES
   micro-batches of [16, 2048]); and of training on it (`python -m smelt_interp.train
   --shards DIR`, the tiny preset's model, TRAIN_STEPS steps of [8, 256] rows). Each process
   reads the same number of rows whatever the corpus size, so the ratio is what the corpus size
   itself costs. Target: large within 1.5x of small. `--tokenizer bytes` prepares the two
   corpora with the byte tokenizer instead of the BPE (bytes encode at tens of millions of
   tokens/s, so 1 GB takes under a minute, where BPE takes about 40 minutes on one core); each
   prepare's wall time and tokens/s are printed beside its RSS (every measured process runs one
   torch and one tokenizers thread). `--memory-only` skips 1 and 2, `--rates-only` skips 3;
   `--stages` picks which of the three processes run (prepare always runs when a later stage
   needs its folder)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from smelt_interp.budget import flops_per_token  # noqa: E402
from smelt_interp.data.bpe import read_tokenizer, train_bpe  # noqa: E402
from smelt_interp.data.prepare import prepare  # noqa: E402
from smelt_interp.data.shards import ShardSet  # noqa: E402
from smelt_interp.data.sources import stdlib_root  # noqa: E402
from smelt_interp.train.config import TrainConfig  # noqa: E402
from smelt_interp.train.presets import get_preset  # noqa: E402
from smelt_interp.train.shard_loader import ShardBatches  # noqa: E402

H200_PEAK = 989e12
LOADER_BATCHES = 200
TRAIN_STEPS = 20
# one thread in every measured process: torch's and the tokenizers library's (Rayon) pools
CLEAN_ENV = {
    "PYTHONPATH": str(REPO),
    "PATH": "/usr/bin:/bin",
    "OMP_NUM_THREADS": "1",
    "RAYON_NUM_THREADS": "1",
}


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


def peak_rss_mib(argv: list[str]) -> float:
    """Peak RSS (MiB) of one fresh process running `argv` (ru_maxrss of the child, read with
    wait4 so an earlier, larger child does not mask it)."""
    return measured_run(argv)[0]


def measured_run(argv: list[str]) -> tuple[float, float]:
    """(peak RSS MiB, wall seconds) of one fresh process running `argv`."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=CLEAN_ENV, text=True
    )
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ...: failed\n{proc.stderr.read()[-2000:]}")
    proc.stderr.close()
    return usage.ru_maxrss / 1024, seconds


def load_rows(folder: str) -> None:
    """The loader alone: LOADER_BATCHES micro-batches of [16, 2048] from `folder`."""
    loader = ShardBatches(ShardSet(folder), {"text": 1.0}, 2048, 16)
    for u in range(LOADER_BATCHES):
        loader.batch(u)


STAGES = ("prepare", "loader", "training")


def memory_rows(
    root: Path, corpora: dict[str, Path], tokenizer: str, stages: Sequence[str] = STAGES
) -> tuple[dict[str, dict], dict[str, tuple[int, float]]]:
    """({stage: {corpus: peak RSS MiB}} for prepare, the loader and training, fresh processes;
    {corpus: (tokens, prepare's wall seconds)}). Each corpus's folder is deleted once measured."""
    rss: dict[str, dict] = {stage: {} for stage in stages}
    rates: dict[str, tuple[int, float]] = {}
    for name, path in corpora.items():
        out = root / f"rss-{name}"
        mib, seconds = measured_run(
            [sys.executable, "-m", "smelt_interp.data", "prepare", str(path), "--out", str(out)]
            + ["--tokenizer", tokenizer, "--quiet"]
        )
        rss.setdefault("prepare", {})[name] = mib
        shards = [shard for group in ShardSet(out).shards.values() for shard in group]
        rates[name] = (sum(shard.header.n_tokens for shard in shards), seconds)
        if "loader" in stages:
            rss["loader"][name] = peak_rss_mib([sys.executable, __file__, "--load-rows", str(out)])
        if "training" not in stages:
            shutil.rmtree(out)
            continue
        train = [sys.executable, "-m", "smelt_interp.train", "--preset", "dyck-pair-tiny"]
        train += ["--arch", "baseline", "--shards", str(out), "--out", str(root / f"t-{name}")]
        for setting in (f"steps={TRAIN_STEPS}", "seq_len=256", "batch_size=8", "grad_accum=1"):
            train += ["--set", setting]
        train += ["--set", "eval_every=100000", "--set", "threads=1", "--quiet"]
        rss["training"][name] = peak_rss_mib(train)
        shutil.rmtree(out)
        shutil.rmtree(root / f"t-{name}", ignore_errors=True)
    return rss, rates


def rates(root: Path, small: Path, tokenizer: Path, vocab: int, small_mb: float) -> None:
    """Sections 1 and 2: prepare against the library's batch encoding, then the loader."""
    tok = read_tokenizer(tokenizer)
    texts = [json.loads(line)["text"] for line in small.read_text().splitlines()]
    n_tokens = sum(len(ids) + 1 for ids in tok.encode_batch(texts))
    lib, ours = [], []
    for r in range(3):  # interleaved rounds, the same texts
        t = time.perf_counter()
        tok.encode_batch(texts)
        lib.append(time.perf_counter() - t)
        t = time.perf_counter()
        prepare([str(small)], root / f"p{r}", str(tokenizer))
        ours.append(time.perf_counter() - t)
    lib_s, ours_s = sorted(lib)[1], sorted(ours)[1]
    print(f"prepare ({small_mb:g} MB of stdlib source, BPE {vocab}, median of 3)")
    print(
        f"  tokenizers encode_batch {n_tokens / lib_s:12,.0f} tokens/s   prepare "
        f"{n_tokens / ours_s:12,.0f} tokens/s   ratio {ours_s / lib_s:.2f}x  (target <= 2x)"
    )

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--small-mb", type=float, default=4)
    p.add_argument("--large-mb", type=float, default=40)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--tokenizer", choices=("bpe", "bytes"), default="bpe", help="for section 3")
    p.add_argument("--memory-only", action="store_true", help="section 3 alone")
    p.add_argument("--rates-only", action="store_true", help="sections 1 and 2 alone")
    p.add_argument("--stages", default=",".join(STAGES), help="section 3's processes")
    p.add_argument("--load-rows", metavar="DIR", help=argparse.SUPPRESS)  # the loader's process
    args = p.parse_args()
    if args.load_rows:
        load_rows(args.load_rows)
        return
    stages = [s for s in args.stages.split(",") if s]
    if not stages or set(stages) - set(STAGES):
        p.error(f"--stages takes some of {','.join(STAGES)}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        small, large = root / "small.jsonl", root / "large.jsonl"
        sample = write_corpus(small, args.small_mb)
        if not args.rates_only:
            write_corpus(large, args.large_mb)
        bpe = root / "tok.json"
        if not args.memory_only or args.tokenizer == "bpe":
            bpe.write_text(train_bpe(iter(sample), args.vocab).json)
        if not args.memory_only:
            rates(root, small, bpe, args.vocab, args.small_mb)
        if args.rates_only:
            return

        # 3. peak RSS of preparing, loading and training, small vs large, fresh processes
        tokenizer = str(bpe) if args.tokenizer == "bpe" else "bytes"
        corpora = {"small": small, "large": large}
        rss, timing = memory_rows(root, corpora, tokenizer, stages)
        shown = f"BPE {args.vocab}" if args.tokenizer == "bpe" else "bytes"
        print(f"prepare's rate ({shown}, one process each)")
        for name, (tokens, seconds) in timing.items():
            mb = args.small_mb if name == "small" else args.large_mb
            print(
                f"  {mb:g} MB: {tokens:,} tokens in {seconds:,.1f} s   "
                f"{tokens / seconds:12,.0f} tokens/s (the process's wall time, start-up included)"
            )
        print(f"peak RSS ({shown}; a fresh process each; the same rows read whatever the size)")
        for stage, by_size in rss.items():
            print(
                f"  {stage:<9} {args.small_mb:g} MB: {by_size['small']:,.0f} MiB   "
                f"{args.large_mb:g} MB: {by_size['large']:,.0f} MiB   "
                f"ratio {by_size['large'] / by_size['small']:.2f}x  (target <= 1.5x)"
            )


if __name__ == "__main__":
    main()
