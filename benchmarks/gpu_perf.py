"""Where a training step's time goes on one GPU, for the paper-200m pair, in one call of at most
9 minutes (gpu/perf_on_device.sh). Five parts, each its own process under a deadline, the JSON
rewritten after each part (and each part's own JSON after each model):

1. env: torch, CUDA and cuDNN versions, the GPU, its SM count and clocks, a bf16 matmul peak;
2. attention: the SDPA backend each model's shape takes, and forward + backward time and
   TFLOP/s under flash, cuDNN, efficient and math alone (skipped, with the reason, where one
   cannot run);
3. experts: the grouped expert chain on one micro-batch with uneven routing, as it is and with
   the MoE switches;
4. profile: torch.profiler over two eager training steps per model: time by kernel category,
   the top 15 kernels, the GPU-busy fraction;
5. ab: every kernel switch (smelt_interp.model.kernels) against the code as it is, on the same
   weights in interleaved rounds, eager, with each model's own peak memory (reset before it is
   built; one model at a time) and MFU.

`--smoke` runs every part on the CPU at tiny sizes in seconds and fills every key the device run
fills (a CUDA-only figure is null with its reason under the part's `null_reasons`);
tests/gpu/test_gpu_perf.py runs it. `--dry-run` prints the plan.

python -m benchmarks.gpu_perf [--smoke] [--dry-run] [--only env,attention,...] [--out JSON]"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpu.parts import OUT_TOKEN, Part, parts_parser, plan_lines, run_parts
from smelt_interp.errors import ConfigError
from smelt_interp.files import atomic_write_text, check_outputs, json_text

PRESET = "paper-200m"
ARCHS = ("baseline", "smelt")
DEADLINES = {"env": 30, "attention": 60, "experts": 60, "profile": 110, "ab": 220}  # 480 s
WHAT = {
    "env": "torch/CUDA/cuDNN versions, GPU, SM count, clocks, bf16 matmul peak",
    "attention": "SDPA backend per model shape; fwd+bwd time and TFLOP/s per backend",
    "experts": "grouped expert chain fwd+bwd with uneven routing, as is and per MoE switch",
    "profile": "torch.profiler over two steps per model: categories, top 15, GPU-busy fraction",
    "ab": "each kernel switch vs the current code, interleaved; peak memory per model; MFU",
}
# The smoke run's pair: the default pair's shape at a tenth of its width, a few rows.
SMOKE_SHAPE = dict(
    d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_head=8, n_experts=4, top_k=2,
    d_expert=16, max_seq_len=64,
)  # fmt: skip
SMOKE_BATCH, SMOKE_SEQ = 2, 32


def shapes(smoke: bool) -> dict[str, tuple[Any, int, int]]:
    """{arch: (ModelConfig, micro-batch rows, row length)}: paper-200m's pair (the matcher's
    SMELT) and its micro-batch, or the smoke run's tiny pair."""
    from smelt_interp.config import ModelConfig

    if smoke:
        return {
            "baseline": (ModelConfig.baseline(**SMOKE_SHAPE), SMOKE_BATCH, SMOKE_SEQ),
            "smelt": (ModelConfig.smelt(**SMOKE_SHAPE), SMOKE_BATCH, SMOKE_SEQ),
        }
    from smelt_interp.train.config import TrainConfig
    from smelt_interp.train.presets import get_preset

    out = {}
    for arch in ARCHS:
        cfg = TrainConfig.from_dict({**get_preset(PRESET), "arch": arch})
        out[arch] = (cfg.model_config(), cfg.batch.size, cfg.batch.seq_len)
    return out


def default_parts(smoke: bool) -> dict[str, Part]:
    flags = ["--smoke"] if smoke else []
    return {
        name: Part(
            name,
            deadline,
            [sys.executable, "-m", "benchmarks.gpu_perf", "--part", name, "--part-out", OUT_TOKEN]
            + flags,
            WHAT[name],
        )
        for name, deadline in DEADLINES.items()
    }


def parse_only(text: str | None) -> list[str]:
    names = list(DEADLINES)
    if text is None:
        return names
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    if not chosen or any(t not in names for t in chosen):
        raise ConfigError(
            f"--only takes a comma-separated list of {', '.join(names)}; got {text!r}"
        )
    return [n for n in names if n in chosen]


def child(part: str, out: Path, smoke: bool) -> int:
    """Run one part in this process, writing its result to `out` as it grows."""
    from benchmarks import perf_parts

    def emit(result: dict[str, Any]) -> None:
        atomic_write_text(out, json_text(result) + "\n")

    if part == "env":
        perf_parts.env_part(emit, smoke)
        return 0
    pair = shapes(smoke)
    if part == "attention":
        perf_parts.attention_part(emit, pair, smoke)
    elif part == "experts":
        perf_parts.experts_part(emit, pair, smoke)
    elif part == "profile":
        perf_parts.profile_part(emit, pair, smoke)
    elif part == "ab":
        peak = None
        if not smoke:
            import torch

            name = torch.cuda.get_device_name()
            peak = next((v for k, v in perf_parts.DATASHEET_TFLOPS.items() if k in name), None)
        budget = 2.0 if smoke else DEADLINES["ab"] - 60  # building and warming up each model
        perf_parts.ab_part(emit, pair, smoke, budget, peak)
    else:
        raise ConfigError(f"unknown part {part!r}")
    return 0


# Every key the device run fills, as dotted paths into the JSON ("*" stands for each arch);
# tests/gpu/test_gpu_perf.py checks that --smoke fills each (a null one with its reason).
PART_KEYS: dict[str, tuple[str, ...]] = {
    "env": (
        "torch", "cuda", "cudnn", "gpu", "sm_count", "sm_clock_mhz", "max_sm_clock_mhz",
        "memory_clock_mhz", "matmul_peak_tflops", "datasheet_tflops",
    ),
    "attention": (
        "models.*.default_backend", "models.*.q_shape", "models.*.flops",
        *(f"models.*.backends.{b}" for b in ("flash", "cudnn", "efficient", "math")),
    ),
    "experts": (
        "models.*.tokens", "models.*.load_max_over_mean",
        *(f"models.*.{v}.{k}" for v in ("current", "moe_gather", "weight_cache")
          for k in ("seconds", "tflops")),
    ),
    "profile": (
        "events", "models.*.categories", "models.*.top_kernels", "models.*.gpu_busy_fraction",
        "models.*.wall_s",
    ),
    "ab": (
        "variants", "smelt_over_baseline", "datasheet_tflops", "models.*.peak_memory_gib",
        "models.*.rounds", "models.*.train_flops_per_token",
        *(f"models.*.variants.{v}.{k}" for v in ("current", "moe_gather", "weight_cache",
          "fused_qkv", "sdpa_cudnn_first", "all")
          for k in ("tokens_per_s", "speedup_vs_current", "peak_memory_gib", "mfu")),
    ),
}  # fmt: skip


def _lookup(node: Any, path: list[str]) -> tuple[bool, Any, dict[str, Any]]:
    """(found, value, the null_reasons nearest the value) along `path`."""
    reasons: dict[str, Any] = {}
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False, None, reasons
        reasons = node.get("null_reasons", reasons) if isinstance(node, dict) else reasons
        node = node[key]
    return True, node, reasons


def missing_keys(report: dict[str, Any]) -> list[str]:
    """The PART_KEYS that `report` lacks, or holds null without a reason under a
    `null_reasons` on its way (every part must have run)."""
    missing = []
    for part, keys in PART_KEYS.items():
        result = ((report.get("parts") or {}).get(part) or {}).get("result")
        for key in keys:
            for arch in ARCHS if "*" in key else ("",):
                path = key.replace("*", arch).split(".")
                found, value, reasons = _lookup(result, path)
                if not found or (value is None and path[-1] not in reasons):
                    missing.append(f"{part}.{'.'.join(path)}")
    return missing


def summary_lines(report: dict[str, Any]) -> list[str]:
    """Per part its status; the A/B's speed-ups and the SMELT/Baseline ratio per variant."""
    lines = [
        f"{name}: {r['status']} in {r['seconds']:.0f} s" for name, r in report["parts"].items()
    ]
    ab = (report["parts"].get("ab") or {}).get("result") or {}
    for arch, rec in (ab.get("models") or {}).items():
        for name, v in rec["variants"].items():
            lines.append(
                f"  {arch:8s} {name:16s} {v['tokens_per_s']:12,.0f} tokens/s  "
                f"x{v['speedup_vs_current']:.3f} vs current"
            )
    for name, ratio in (ab.get("smelt_over_baseline") or {}).items():
        lines.append(f"  SMELT / Baseline ({name}): {ratio:.3f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = parts_parser("gpu_perf", "python -m benchmarks.gpu_perf", ", ".join(DEADLINES))
    p.add_argument("--smoke", action="store_true", help="every part on the CPU at tiny sizes")
    args = p.parse_args(argv)
    try:
        if args.part:
            if args.part_out is None:
                raise ConfigError("--part needs --part-out PATH (it is run by gpu_perf itself)")
            return child(args.part, args.part_out, args.smoke)
        names = parse_only(args.only)
        check_outputs({}, {"--out": args.out})
    except ConfigError as exc:
        print(f"gpu_perf: {exc}", file=sys.stderr)
        return 2
    parts = [default_parts(args.smoke)[n] for n in names]
    if args.dry_run:
        print("\n".join(plan_lines("gpu_perf", parts, args.out)))
        return 0
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu_perf: no CUDA device here; it needs one GPU (--smoke runs on the CPU)",
              file=sys.stderr)  # fmt: skip
        return 2
    header = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": "cpu (smoke)" if args.smoke else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "smoke": args.smoke,
        "preset": None if args.smoke else PRESET,
    }
    report = run_parts(parts, args.out, header, tag="smelt-gpu-perf")
    print("\n".join(["== summary", *summary_lines(report)]))
    return 0 if all(r["status"] == "ok" for r in report["parts"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
