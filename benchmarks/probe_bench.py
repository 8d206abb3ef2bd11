"""The sink probe against a `run_with_cache` of the full attention pattern, at 1k, 4k and 16k
tokens: peak added memory and time of each, as ratios, and the probe's throughput in tokens/s.

The probe caches only post-RoPE Q and K and recomputes the pattern a chunk of queries at a
time, so its memory grows with T (plus chunk x T per head); the full-pattern cache holds
[heads, T, T] per visit, so it grows with T^2 and stops fitting in memory at 16k here, where it
is skipped with the size it would need.

python -m benchmarks.probe_bench [--quick] [--lengths 1024,4096,16384]"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch

from benchmarks.measure import mib, peak_extra_rss
from smelt_interp.config import ModelConfig
from smelt_interp.measure.attention_stats import DEFAULT_CHUNK
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes import sink

# The default pair's SMELT shape (4 layers, layers 1-2 twice: 6 visits, 4 heads of 22).
SHAPE = dict(
    d_model=96, n_layers=4, n_heads=4, n_kv_heads=2, d_head=22, n_experts=12, top_k=2, d_expert=120
)
MEMORY_LIMIT = 12 * 2**30  # leave the full-pattern cache out above this estimate


def pattern_cache_bytes(model: SmeltModel, t: int) -> int:
    """What run_with_cache of every visit's hook_pattern holds (float32)."""
    return len(model.schedule) * model.cfg.n_heads * t * t * 4


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="1024,4096,16384")
    p.add_argument("--quick", action="store_true", help="1k and 4k only")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.quick:
        lengths = [t for t in lengths if t <= 4096]
    torch.manual_seed(0)
    model = SmeltModel(ModelConfig.smelt(max_seq_len=max(lengths), init_std=0.1, **SHAPE)).eval()
    print(
        f"sink probe vs run_with_cache(hook_pattern), {len(model.schedule)} visits x "
        f"{model.cfg.n_heads} heads, batch 1, chunk {DEFAULT_CHUNK}, {args.threads} threads"
    )
    for t in lengths:
        tokens = torch.randint(0, 256, (1, t))
        tokens[0, 0] = model.cfg.bos_token_id
        with torch.no_grad():
            probe_s, result = timed(lambda: sink.measure(model, tokens))
            probe_mem = peak_extra_rss(lambda: sink.measure(model, tokens))
        line = (
            f"  T={t:6d}: probe {probe_s:7.2f} s, peak +{mib(probe_mem):>10}, "
            f"{t / probe_s:8,.0f} tokens/s"
        )
        need = pattern_cache_bytes(model, t)
        if need > MEMORY_LIMIT:
            print(f"{line} | full-pattern cache needs {need / 2**30:,.0f} GiB: skipped")
            continue
        names = lambda n: n.endswith("hook_pattern")  # noqa: E731
        with torch.no_grad():
            full_s, (_, cache) = timed(lambda: model.run_with_cache(tokens, names_filter=names))
            full_mem = peak_extra_rss(lambda: model.run_with_cache(tokens, names_filter=names))
        # the probe's answer equals the mean BOS column of the cached pattern
        ref = torch.stack(
            [cache[k][0, :, 1:, 0].mean(-1) for k in model.hook_names("attn.hook_pattern")]
        )
        diff = (ref.flatten() - torch.tensor(result["sink_mass"].to_numpy())).abs().max()
        del cache
        ratio_mem = (full_mem / probe_mem) if probe_mem and full_mem else float("nan")
        print(
            f"{line} | full pattern {full_s:7.2f} s, peak +{mib(full_mem):>10} | "
            f"memory ratio full/probe {ratio_mem:6.1f}x, time ratio {full_s / probe_s:5.2f}x, "
            f"max |diff| {diff:.1e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
