"""The GPU check: one command that, on one CUDA GPU, in at most 7 minutes,

1. tests: runs the CUDA-only tests (`pytest tests/gpu/test_cuda.py`: bf16 autocast against fp32,
   bf16 grouped_mm against the per-expert loop, flash SDPA against the explicit path, cached
   generation against recompute, the head-width rules against torch's SDPA checks, a probe on
   the grouped path, training with pinned batches and a resume on the device);
2. sink: runs the sink probe on the paper-scale SMELT shape (`paper-200m`, random weights,
   bf16 autocast) at 16k and 64k tokens: seconds, tokens/s, peak GPU memory;
3. train: trains the `paper-200m` preset compiled (one Block graph; eager, with the reason, if
   compiling fails or overruns its share), Baseline and SMELT in interleaved rounds, and prints
   tokens/s, compile seconds, MFU against the H200's 989 TFLOP/s dense bf16 datasheet peak and,
   second, against a bf16 matmul peak measured in the same run, with the SMELT / Baseline
   ratio. Targets: MFU >= 35% (datasheet) for the Baseline, ratio >= 0.95.

Each part runs in its own process under a deadline: a part that fails or runs past its
deadline is killed and recorded as such, and the other parts still run. `--out PATH` writes
every part's record as JSON (atomically, after each part, so an interrupted run keeps what
finished). `--dry-run` prints the plan and runs nothing heavy (no GPU needed).

python -m gpu.check [--dry-run] [--only tests,sink,train] [--out results.json]"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpu.parts import OUT_TOKEN, Part, parts_parser, plan_lines, run_parts
from gpu.parts import run_part as parts_run_part
from smelt_interp.errors import ConfigError
from smelt_interp.files import atomic_write_text, check_outputs, json_text

PRESET = "paper-200m"
TRAIN_ROUNDS = 10  # interleaved timed rounds per model (A B, B A, ...)
TRAIN_ROUND_STEPS = 5  # optimizer steps a round (131,072 tokens each)
TRAIN_WARMUP = 3  # untimed steps first: compilation happens in the first
SINK_LENGTHS = (16384, 65536)
SINK_CHUNK = 512  # queries per recomputed chunk of attention rows
TARGET_MFU = 0.35  # Baseline
TARGET_RATIO = 0.95  # SMELT / Baseline tokens/s


def _self(part: str) -> list[str]:
    return [sys.executable, "-m", "gpu.check", "--part", part, "--part-out", OUT_TOKEN]


def default_parts() -> dict[str, Part]:
    """The three parts in run order; deadlines add up to 420 s (7 min), which leaves a minute
    of the device script's 8 for installing the wheels and starting Python."""
    return {
        "tests": Part(
            "tests",
            60,
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "tests/gpu/test_cuda.py",
            ],
            "CUDA-only tests: bf16 autocast vs fp32, bf16 grouped_mm vs loop, flash SDPA vs "
            "explicit, cached generation vs recompute, head widths vs torch's SDPA checks, a "
            "probe on the grouped path, pinned batches and a resume on the device",
            env={"SMELT_CUDA_TESTS_DEVICE": "cuda"},
        ),
        "sink": Part(
            "sink",
            60,
            _self("sink"),
            f"sink probe on the {PRESET} SMELT shape (random weights, bf16 autocast) at "
            f"{', '.join(f'{t // 1024}k' for t in SINK_LENGTHS)} tokens, chunk {SINK_CHUNK}",
        ),
        "train": Part(
            "train",
            300,
            _self("train"),
            f"{PRESET} compiled (eager with the reason if compiling fails or takes over a "
            f"third), Baseline and SMELT interleaved, {TRAIN_WARMUP} warm-up steps, then "
            f"{TRAIN_ROUNDS} rounds of {TRAIN_ROUND_STEPS} timed steps each; tokens/s, MFU vs "
            f"the 989 TFLOP/s datasheet peak (target >= {TARGET_MFU:.0%} Baseline) and vs a "
            f"measured matmul peak, SMELT/Baseline ratio (target >= {TARGET_RATIO})",
        ),
    }


def parse_only(text: str | None) -> list[str]:
    """`--only tests,sink` -> ["tests", "sink"] in run order; None -> every part."""
    names = list(default_parts())
    if text is None:
        return names
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in chosen if t not in names]
    if unknown or not chosen:
        raise ConfigError(
            f"--only takes a comma-separated list of {', '.join(names)}; got {text!r}"
        )
    return [n for n in names if n in chosen]


# ----- running parts ----------------------------------------------------------------------------


def run_part(part: Part, result_path: Path, echo: bool = True) -> dict[str, Any]:
    """gpu.parts.run_part, with the tests part's record read from pytest's summary line: it
    fails where nothing ran or a test was skipped."""
    record = parts_run_part(part, result_path, echo)
    if part.name == "tests":
        record["result"] = pytest_summary(record["log_tail"])
        if record["status"] == "ok" and not record["result"].get("passed"):
            record["status"] = "failed"  # nothing ran (e.g. every test skipped)
        if record["status"] == "ok" and record["result"].get("skipped"):
            record["status"] = "failed"
    return record


def pytest_summary(lines: Sequence[str]) -> dict[str, Any]:
    """Counts from pytest's last summary line ('3 passed, 1 failed in 2.1s')."""
    for line in reversed(lines):
        counts = re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)\b", line)
        if counts:
            out: dict[str, Any] = {"line": line.strip("= ")}
            for n, kind in counts:
                kind = "errors" if kind.startswith("error") else kind
                out[kind] = out.get(kind, 0) + int(n)
            return out
    return {}


# ----- the heavy parts (run in a child process) --------------------------------------------


def sink_part(
    lengths: Sequence[int],
    emit: Callable[[dict[str, Any]], None],
    *,
    model_fields: dict[str, Any] | None = None,
    device: str = "cuda",
    chunk: int = SINK_CHUNK,
) -> dict[str, Any]:
    """The sink probe at each length on the preset's SMELT shape (or `model_fields`), under
    bf16 autocast on CUDA; `emit` gets the results so far after each length."""
    import torch

    from smelt_interp.config import ModelConfig
    from smelt_interp.model.transformer import SmeltModel
    from smelt_interp.probes import sink
    from smelt_interp.train.config import TrainConfig
    from smelt_interp.train.presets import get_preset

    if model_fields is None:
        shape = TrainConfig.from_dict({**get_preset(PRESET), "arch": "smelt"}).model_config()
    else:
        shape = ModelConfig.smelt(**model_fields)
    cfg = shape.replace(max_seq_len=max(lengths))
    dev = torch.device(device)
    torch.manual_seed(0)
    model = SmeltModel(cfg).to(dev).eval()
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    results: dict[str, Any] = {"model": cfg.to_dict(), "chunk": chunk, "lengths": {}}
    warm_up = (False, min(1024, *lengths))  # a short first call, not reported
    for report, t in (warm_up, *((True, t) for t in lengths)):
        gen = torch.Generator().manual_seed(t)
        tokens = torch.randint(0, 256, (1, t), generator=gen)  # bytes
        tokens[0, 0] = cfg.bos_token_id
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        start = time.perf_counter()
        with torch.no_grad(), autocast:
            heads = sink.measure(model, tokens, chunk=chunk)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - start
        if not report:
            continue
        row = {
            "seconds": seconds,
            "tokens_per_s": t / seconds,
            "peak_memory_gib": (
                torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None
            ),
            "heads": len(heads),
            "mean_sink_mass": float(heads["sink_mass"].mean()),
            "uniform_mass": float(heads["uniform_mass"].iloc[0]),
            "finite": bool(heads["sink_mass"].notna().all()),
        }
        results["lengths"][str(t)] = row
        print(
            f"T={t:6d}: {seconds:6.2f} s, {row['tokens_per_s']:10,.0f} tokens/s, "
            f"peak {row['peak_memory_gib'] or 0:.1f} GiB, mean sink mass "
            f"{row['mean_sink_mass']:.4f} (uniform {row['uniform_mass']:.2e})",
            flush=True,
        )
        emit(results)
    if not all(r["finite"] for r in results["lengths"].values()):
        raise RuntimeError("the sink probe returned NaN masses")
    return results


def train_part(
    emit: Callable[[dict[str, Any]], None],
    *,
    preset: str = PRESET,
    rounds: int = TRAIN_ROUNDS,
    steps_per_round: int = TRAIN_ROUND_STEPS,
    warmup: int = TRAIN_WARMUP,
    budget_s: float = 290.0,
    device: str = "cuda",
    compile_model: bool = True,
    peak_tflops: float | None = None,
    datasheet_tflops: float | None = None,
) -> dict[str, Any]:
    """Measured matmul peak, then Baseline and SMELT prepared (compiled; eager with the reason
    if a compile fails or takes more than a third of `budget_s`) and timed in interleaved
    rounds until `budget_s` is spent: tokens/s, MFU against the datasheet peak (the H200's
    989 TFLOP/s unless given) and against the measured one, compile seconds apart, and the
    SMELT/Baseline ratio."""
    import torch

    from benchmarks.gpu_train import (
        H200_DENSE_BF16_TFLOPS,
        interleaved,
        matmul_peak_tflops,
        mfu,
        preset_config,
    )

    start = time.monotonic()
    datasheet_tflops = datasheet_tflops or H200_DENSE_BF16_TFLOPS
    if peak_tflops is None and torch.device(device).type == "cuda":
        peak_tflops = matmul_peak_tflops()
        print(f"{torch.cuda.get_device_name()}: bf16 matmul peak {peak_tflops:.0f} TFLOP/s")
    results: dict[str, Any] = {
        "preset": preset,
        "peak_tflops": peak_tflops,
        "datasheet_tflops": datasheet_tflops,
        "models": {},
    }
    emit(results)
    cfgs = {a: preset_config(preset, a, compile_model, device) for a in ("baseline", "smelt")}
    models = interleaved(
        cfgs,
        rounds,
        steps_per_round,
        warmup,
        deadline=start + budget_s,
        compile_budget_s=budget_s / 3,
    )
    for arch, r in models.items():
        tps = r["tokens_per_s"]
        r["mfu"] = mfu(tps, r["train_flops_per_token"], datasheet_tflops) if tps else None
        r["mfu_measured_peak"] = (
            mfu(tps, r["train_flops_per_token"], peak_tflops) if tps and peak_tflops else None
        )
        results["models"][arch] = r
        print(train_line(arch, r), flush=True)
    b, s = results["models"]["baseline"], results["models"]["smelt"]
    if b["tokens_per_s"] and s["tokens_per_s"]:
        results["smelt_over_baseline"] = s["tokens_per_s"] / b["tokens_per_s"]
        results["round_ratios"] = [
            x / y for x, y in zip(s["round_tokens_per_s"], b["round_tokens_per_s"])
        ]
    emit(results)
    return results


def train_line(arch: str, r: dict[str, Any]) -> str:
    tps = r["tokens_per_s"]
    figures = "no timed step ran" if tps is None else f"{tps:12,.0f} tokens/s"
    use = "" if r.get("mfu") is None else f"  MFU {r['mfu']:6.1%} of the datasheet peak"
    if r.get("mfu_measured_peak") is not None:
        use += f" ({r['mfu_measured_peak']:.1%} of the measured)"
    if r.get("compile_s"):
        use += f"  compile {r['compile_s']:.0f} s"
    if r.get("compile_fallback"):
        use += f"  EAGER: {r['compile_fallback']}"
    mem = "" if r.get("peak_memory_gib") is None else f"  peak {r['peak_memory_gib']:.1f} GiB"
    cut = "  (deadline: truncated)" if r["truncated"] else ""
    return (
        f"  {arch:8s} {figures}{use}{mem}  {r['steps']} steps, warm-up {r['warmup_s']:.0f} s{cut}"
    )


def child(part: str, out: Path) -> int:
    """Run one heavy part in this process, writing its results to `out` as they come."""

    def emit(results: dict[str, Any]) -> None:
        atomic_write_text(out, json_text(results) + "\n")

    if part == "sink":
        sink_part(SINK_LENGTHS, emit)
    elif part == "train":
        train_part(emit, budget_s=default_parts()["train"].deadline_s - 20)
    else:
        raise ConfigError(f"unknown part {part!r}")
    return 0


# ----- the report -------------------------------------------------------------------------------


def verdict(value: float | None, target: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "not measured"
    return "met" if value >= target else "MISSED"


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The figures beside their targets, one line each."""
    parts = report["parts"]
    out = []
    if "tests" in parts:
        t = parts["tests"]
        out.append(f"tests: {t['status']}  {(t['result'] or {}).get('line', '')}".rstrip())
    if "sink" in parts:
        s = parts["sink"]
        lengths = (s["result"] or {}).get("lengths", {})
        figs = ", ".join(
            f"{int(t) // 1024}k: {r['seconds']:.1f} s, {r['peak_memory_gib'] or 0:.1f} GiB"
            for t, r in lengths.items()
        )
        out.append(f"sink: {s['status']}  {figs}".rstrip())
    if "train" in parts:
        t = parts["train"]
        models = (t["result"] or {}).get("models", {})
        out.append(f"train: {t['status']}  peak {(t['result'] or {}).get('peak_tflops')} TFLOP/s")
        for arch, r in models.items():
            out.append(train_line(arch, r))
        b = models.get("baseline", {})
        b_mfu = b.get("mfu")
        mfu_text = "n/a" if b_mfu is None else f"{b_mfu:.1%}"
        out.append(
            f"  Baseline MFU {mfu_text} (target >= {TARGET_MFU:.0%}: {verdict(b_mfu, TARGET_MFU)})"
        )
        ratio = (t["result"] or {}).get("smelt_over_baseline")
        ratio_text = "n/a" if ratio is None else f"{ratio:.3f}"
        out.append(
            f"  SMELT / Baseline tokens/s {ratio_text} (target >= {TARGET_RATIO}: "
            f"{verdict(ratio, TARGET_RATIO)})"
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = parts_parser(
        "gpu_check",
        "python -m gpu.check",
        "tests, sink, train (default: all)",
        description=__doc__.splitlines()[0],
    )
    args = p.parse_args(argv)
    try:
        if args.part:
            if args.part_out is None:
                raise ConfigError("--part needs --part-out PATH (it is run by gpu_check itself)")
            return child(args.part, args.part_out)
        names = parse_only(args.only)
        check_outputs({}, {"--out": args.out})
    except ConfigError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    parts = [default_parts()[n] for n in names]
    if args.dry_run:
        print("\n".join(plan_lines("gpu_check", parts, args.out)))
        return 0
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here; it needs one GPU (--dry-run prints the plan)",
            file=sys.stderr,
        )
        return 2
    header = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "targets": {"baseline_mfu": TARGET_MFU, "smelt_over_baseline": TARGET_RATIO},
    }
    print(f"gpu_check on {header['device']}, torch {header['torch']}", flush=True)
    report = run_parts(parts, args.out, header, runner=run_part, tag="smelt-gpu-check")
    print("\n".join(["== summary", *summary_lines(report)]))
    if args.out is not None:
        print(f"results written to {args.out}")
    return 0 if all(r["status"] == "ok" for r in report["parts"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
