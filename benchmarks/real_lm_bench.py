"""The real pretrained model (SmolLM2-135M, `make real-lm`): the sink probe on 32 rows of 64
tokens of Python source, its time and its peak added memory against the model's weights; and a
forward pass looped at inference against the unlooped one, time per token as a ratio beside the
ratio of effective depths (what the extra layer calls alone would cost).

python -m benchmarks.real_lm_bench [--spans 12:18,8:22] [--rows 32] [--threads 1]"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch

from benchmarks.measure import interleaved_medians, mib, peak_extra_rss
from smelt_interp.adapters.real_lm import FOLDER, manifest_problem
from smelt_interp.loading import load_model
from smelt_interp.probes import registry
from smelt_interp.probes.inputs import ProbeRequest
from smelt_interp.probes.session import make_inputs, options, run_probe


def sink_probe(rows: int) -> None:
    """Time and peak added memory of the sink probe on `rows` rows of 64 tokens."""
    model, info = load_model(FOLDER, "cpu")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    request = ProbeRequest(data="code", n_seqs=rows, seq_len=64, batch_size=8)
    models, infos = {"m": model}, {"m": info}
    inputs = make_inputs(request, models, infos)
    inputs.batch()  # the rows are built once, outside the timing
    spec = registry.get("sink")
    run = lambda: run_probe(spec, models, inputs, options(request))  # noqa: E731
    run()  # warm-up
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    peak = peak_extra_rss(run)
    ratio = "n/a" if peak is None else f"{peak / weights:.2f}x"
    print(
        f"sink probe, {rows} rows x 64 tokens: {seconds:.2f} s ({rows * 64 / seconds:,.0f} "
        f"tokens/s); peak added memory {mib(peak)} = {ratio} the weights ({mib(weights)})"
    )


def loop_cost(spans: Sequence[str], repeats: int) -> None:
    """Median forward time per token of each FOLDER@SPAN against the unlooped model."""
    tokens = torch.randint(0, 49152, (4, 128), generator=torch.Generator().manual_seed(0))
    models = {"unlooped": load_model(FOLDER, "cpu")[0]}
    models |= {span: load_model(f"{FOLDER}@{span}", "cpu")[0] for span in spans}
    depth = {name: m.cfg.effective_depth for name, m in models.items()}
    with torch.no_grad():
        fns = {name: (lambda m=m: m(tokens)) for name, m in models.items()}
        medians = interleaved_medians(fns, repeats=repeats)
    base = medians["unlooped"]
    per_token = lambda s: 1e3 * s / tokens.numel()  # noqa: E731
    print(f"forward, batch 4 x 128 tokens, median of {repeats} interleaved rounds:")
    for name, seconds in medians.items():
        print(
            f"  {name:>9}: depth {depth[name]:2d}, {per_token(seconds):.3f} ms/token, "
            f"{seconds / base:.2f}x unlooped (depth ratio {depth[name] / depth['unlooped']:.2f}x)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spans", default="12:18,8:22")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="8 rows, 3 rounds")
    args = p.parse_args(argv)
    problem = manifest_problem(FOLDER)
    if problem is not None:
        print(f"real model not prepared ({problem}; make real-lm): skipped")
        return 0
    torch.set_num_threads(args.threads)
    sink_probe(8 if args.quick else args.rows)
    loop_cost([s for s in args.spans.split(",") if s], 3 if args.quick else args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
