"""The paper's mechanism in a language model trained on real text, on one GPU, in one call of at
most 9 minutes (`bash gpu/lm_pair_on_device.sh`, which installs the carried wheels first):

1. corpus: the text the machine holds (its packages' Python source and documentation, the
   standard library, /usr/share/doc, C/C++/CUDA headers; each document once) gathered and made
   into BPE shards with all its cores: `python -m smelt_interp.data gather ... --shards`;
2. train: lm-pair-gpu's Baseline and SMELT trained on them side by side on the one GPU, each
   `python -m smelt_interp.train --preset lm-pair-gpu --shards ...` (a constant rate after
   warmup, so a run the deadline stops is the same run read for fewer tokens); its record reads
   each run's metrics.jsonl: tokens/s, tokens read, the held-out losses, and the sink over
   training (BOS mass per (layer, visit) and Sink^0.3, every 100 steps);
3. suite: the paper's section-6 probes on both checkpoints: the in-context Dyck case study in
   the models' own tokens (answer-position BOS and demonstration mass per (layer, visit), head
   means and best head, visit 1 - visit 0 for the same head), Sink^0.3, Q/K/V cosine and top-8
   overlap between visits beside their consecutive-layer control, routing reuse, residual
   writes; on held-out rows of the shards.

One JSON (`--out`, rewritten after each part) holds the parts' records and a `finding` block:
the Baseline's onset curve, the sink target (Sink^0.3 >= 0.3 over the last 3 evaluations),
and both models' case-study summaries. `--collect DIR` copies there what the device tool can
return: the metrics logs, and each checkpoint under its 16 MiB limit. `--simulate` runs the
same parts at a size seconds train on a CPU (lm-pair-gpu-tiny, 3 MiB of this machine's text, a
512-id vocabulary); tests/gpu/test_lm_pair.py runs it.

python -m gpu.lm_pair [--simulate] [--sequential] [--dry-run] [--work DIR] [--out JSON]
    [--collect DIR]"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpu.parts import OUT_TOKEN, OneLineParser, Part, Record, plan_lines, run_part, run_parts
from smelt_interp.errors import ConfigError, SmeltError
from smelt_interp.files import atomic_write_text, check_outputs, json_text

ARCHS = ("baseline", "smelt")
SUITE = ("case_study", "sink", "similarity", "routing", "residual")  # probe modules, in order
SINK_TARGET = 0.3  # the Baseline's Sink^0.3 ...
SINK_TARGET_EVALS = 3  # ... at least this over its last evaluations
RETURN_LIMIT_BYTES = 16 << 20  # the largest file the device tool brings back
PAPER_CASE_STUDY = {"bos_mass_visit_0": 0.60, "bos_mass_visit_1": 0.02}  # head means, Dyck


@dataclass(frozen=True)
class Scale:
    """How big a run is: the preset, the corpus's byte budget and vocabulary, the probe rows,
    where it runs, and each part's deadline in seconds."""

    preset: str
    corpus_bytes: int
    vocab_size: int
    probe_rows: int
    probe_seq_len: int
    device: str
    deadlines: dict[str, float]


# 9 minutes in all: 520 s of parts, the rest for installing the wheels and starting Python.
DEVICE = Scale(
    "lm-pair-gpu", 320 << 20, 8192, 32, 512, "cuda", {"corpus": 100, "train": 370, "suite": 50}
)
SIMULATE = Scale(
    "lm-pair-gpu-tiny", 3 << 20, 512, 4, 128, "cpu", {"corpus": 180, "train": 300, "suite": 300}
)


@dataclass(frozen=True)
class Layout:
    """The working folder: staged text, shards, the two runs."""

    work: Path

    @property
    def stage(self) -> Path:
        return self.work / "stage"

    @property
    def shards(self) -> Path:
        return self.work / "shards"

    @property
    def runs(self) -> Path:
        return self.work / "runs"

    def run(self, arch: str) -> Path:
        return self.runs / arch


def _self(part: str, work: Path, simulate: bool, *extra: str) -> list[str]:
    flags = ["--simulate"] if simulate else []
    return [sys.executable, "-m", "gpu.lm_pair", "--part", part, "--part-out", OUT_TOKEN,
            "--work", str(work), *flags, *extra]  # fmt: skip


def train_argv(scale: Scale, layout: Layout, arch: str) -> list[str]:
    return [
        sys.executable, "-m", "smelt_interp.train", "--preset", scale.preset, "--arch", arch,
        "--shards", str(layout.shards), "--out", str(layout.runs), "--quiet",
    ]  # fmt: skip


def default_parts(scale: Scale, layout: Layout, simulate: bool, sequential: bool) -> list[Part]:
    """The three parts in run order."""
    corpus = [
        sys.executable, "-m", "smelt_interp.data", "gather", "--out", str(layout.stage),
        "--max-bytes", str(scale.corpus_bytes), "--shards", str(layout.shards),
        "--tokenizer", f"bpe:{scale.vocab_size}", "--quiet", "--json", OUT_TOKEN,
    ]  # fmt: skip
    train = _self("train", layout.work, simulate, *(["--sequential"] if sequential else []))
    how = "one after the other" if sequential else "side by side on the one device"
    env = {"OMP_WAIT_POLICY": "PASSIVE"}
    return [
        Part("corpus", scale.deadlines["corpus"], corpus,
             f"this machine's text, {scale.corpus_bytes >> 20} MiB at most, into "
             f"bpe:{scale.vocab_size} shards", env),
        Part("train", scale.deadlines["train"], train,
             f"{scale.preset} Baseline and SMELT on the shards, {how}", env),
        Part("suite", scale.deadlines["suite"], _self("suite", layout.work, simulate),
             f"{', '.join(SUITE)} on both checkpoints ({scale.probe_rows} held-out rows of "
             f"{scale.probe_seq_len} tokens; Dyck prompts for the case study)", env),
    ]  # fmt: skip


# ----- the parts that run in a child process ----------------------------------------------------


def train_both(scale: Scale, layout: Layout, sequential: bool) -> int:
    """Both trainings, side by side (or one after the other); the exit code is the worst."""
    logs = {arch: layout.work / f"train-{arch}.log" for arch in ARCHS}
    codes = []
    if sequential:
        for arch in ARCHS:
            with open(logs[arch], "w") as log:
                codes.append(subprocess.call(train_argv(scale, layout, arch), stdout=log,
                                             stderr=subprocess.STDOUT))  # fmt: skip
    else:
        handles = {arch: open(logs[arch], "w") for arch in ARCHS}
        try:
            procs = [
                subprocess.Popen(train_argv(scale, layout, a), stdout=h, stderr=subprocess.STDOUT)
                for a, h in handles.items()
            ]
            codes = [p.wait() for p in procs]
        finally:
            for h in handles.values():
                h.close()
    for arch, code in zip(ARCHS, codes):
        tail = logs[arch].read_text(errors="replace").strip().splitlines()[-3:]
        print(f"{arch}: exit {code}; " + " | ".join(tail), flush=True)
    return max(codes)


def suite(scale: Scale, layout: Layout, emit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The section-6 probes on both checkpoints; `emit` gets the record after each probe."""
    import importlib

    from smelt_interp.loading import load_models
    from smelt_interp.probes.cli import describe_models, records
    from smelt_interp.probes.inputs import ProbeRequest
    from smelt_interp.probes.session import make_inputs, options, run_probe

    paths = [layout.run(arch) / "ckpt.pt" for arch in ARCHS]
    models, infos = load_models(paths, scale.device)
    request = ProbeRequest(
        data=str(layout.shards), n_seqs=scale.probe_rows, seq_len=scale.probe_seq_len,
        task="dyck",
    )  # fmt: skip
    inputs = make_inputs(request, models, infos)
    out: dict[str, Any] = {
        "models": describe_models(models, infos),
        "tokens_trained": {label: info.meta.get("tokens") for label, info in infos.items()},
        "inputs": {"data": "held-out rows of the shards", "n_seqs": inputs.n_seqs,
                   "seq_len": inputs.seq_len, "demos": list(inputs.demos), "task": "dyck"},
        "probes": {},
    }  # fmt: skip
    for name in SUITE:
        spec = importlib.import_module(f"smelt_interp.probes.{name}").PROBE
        start = time.perf_counter()
        result = run_probe(spec, models, inputs, options(request), skip_inapplicable=True)
        out["probes"][name] = {
            "seconds": round(time.perf_counter() - start, 2),
            "summary": records(result.summary),
            "skipped": result.skipped,
            "tables": {t: records(df) for t, df in result.tables.items()},
        }
        print(f"{name}: {out['probes'][name]['seconds']:.1f} s", flush=True)
        emit(out)
    return out


# ----- what the parent reads from the runs ----------------------------------------------------


def train_record(run: Path) -> dict[str, Any]:
    """One run as its metrics.jsonl tells it: steps and tokens read, tokens/s (the median of
    the logged windows after the first, which holds compilation), the last evaluation, and the
    sink over training (one row per evaluation: BOS mass per (layer, visit), Sink^0.3)."""
    import numpy as np

    from smelt_interp.train.metrics import main_evals, read_metrics
    from smelt_interp.train.sink_eval import sink_table

    path = run / "metrics.jsonl"
    metrics = read_metrics(path) if path.is_file() else []
    train = [r for r in metrics if r.get("event") == "train"]
    evals = list(main_evals(metrics))
    speeds = [r["tokens_per_s"] for r in train if r.get("tokens_per_s")]
    later = speeds[len(speeds) // 10 + 1 :] or speeds
    table = sink_table(metrics)
    curve = []
    for step, rows in table.groupby("step", sort=True):
        ev = next(e for e in evals if e.get("step") == step)
        curve.append({
            "step": int(step), "tokens": ev.get("tokens"),
            "sink03_gu": _number(rows["sink03_gu"].iloc[0]),
            "sink03_64": float(rows["sink03_64"].iloc[0]),
            "bos_mass": {f"{r.layer}.{r.visit}": float(r.sink_mass) for r in rows.itertuples()},
            "bos_mass_mean": float(rows["sink_mass"].mean()),
            "loss": {k[5:]: v for k, v in ev.items() if k.startswith("loss/")},
        })  # fmt: skip
    return {
        "steps": train[-1]["step"] if train else 0,
        "tokens_read": train[-1]["tokens"] if train else 0,
        "tokens_per_s": float(np.median(later)) if later else None,
        "checkpoint": (run / "ckpt.pt").is_file(),
        "last_eval": evals[-1] if evals else None,
        "sink_curve": curve,
    }


def _number(value: Any) -> float | None:
    """A float, or None for a missing value (NaN or None in a log without the key)."""
    return None if value is None or value != value else float(value)


def _train_runner(layout: Layout) -> Callable[[Part, Path, bool], Record]:
    def runner(part: Part, result_path: Path, echo: bool) -> Record:
        record = run_part(part, result_path, echo)
        if part.name == "train":
            record["result"] = {arch: train_record(layout.run(arch)) for arch in ARCHS}
        return record

    return runner


def finding(report: dict[str, Any]) -> dict[str, Any]:
    """The Baseline's sink target and onset, and both models' case-study summaries."""
    train = (report["parts"].get("train") or {}).get("result") or {}
    curve = (train.get("baseline") or {}).get("sink_curve") or []
    # Gu et al.'s Sink^0.3 where the log has it; the pooled figure of older logs otherwise
    key = (
        "sink03_gu" if curve and all(p.get("sink03_gu") is not None for p in curve) else "sink03_64"
    )
    last = [p[key] for p in curve[-SINK_TARGET_EVALS:]]
    held = min(last) if len(last) == SINK_TARGET_EVALS else None
    suite_result = (report["parts"].get("suite") or {}).get("result") or {}
    case = (suite_result.get("probes") or {}).get("case_study") or {}
    return {
        "baseline_sink03_last_evals": last,
        "sink03_key": key,
        "sink_target": {"min_over_last": SINK_TARGET_EVALS, "at_least": SINK_TARGET,
                        "met": None if held is None else bool(held >= SINK_TARGET)},
        "baseline_onset": [{"tokens": p["tokens"], key: p[key],
                            "bos_mass_mean": p["bos_mass_mean"]} for p in curve],
        "case_study_summary": case.get("summary"),
        "paper_case_study": PAPER_CASE_STUDY,
    }  # fmt: skip


# Every key the device run fills, as dotted paths into the JSON (tests/gpu/test_lm_pair.py
# checks that --simulate fills each one).
FILLED_KEYS = (
    "device", "torch", "preset", "finding.baseline_sink03_last_evals",
    "finding.sink_target.met", "finding.baseline_onset", "finding.case_study_summary",
    "parts.corpus.result.unique_tokens", "parts.corpus.result.documents",
    "parts.corpus.result.bytes", "parts.corpus.result.domains",
    *(f"parts.train.result.{a}.{k}" for a in ARCHS
      for k in ("steps", "tokens_read", "tokens_per_s", "last_eval", "sink_curve")),
    "parts.suite.result.models", "parts.suite.result.tokens_trained",
    *(f"parts.suite.result.probes.{p}.{k}" for p in SUITE for k in ("summary", "tables")),
)  # fmt: skip


def missing_keys(report: dict[str, Any]) -> list[str]:
    """The FILLED_KEYS that `report` lacks or holds empty (None, or an empty list or dict)."""
    missing = []
    for path in FILLED_KEYS:
        node: Any = report
        for key in path.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        if node is None or (isinstance(node, (list, dict)) and not node):
            missing.append(path)
    return missing


def collect(layout: Layout, dest: Path) -> list[str]:
    """Copy into `dest` what the device tool can bring back: each run's metrics.jsonl, and its
    checkpoint where it is under RETURN_LIMIT_BYTES. Returns what was copied."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for arch in ARCHS:
        for name, limit in (("metrics.jsonl", None), ("ckpt.pt", RETURN_LIMIT_BYTES)):
            src = layout.run(arch) / name
            if src.is_file() and (limit is None or src.stat().st_size < limit):
                shutil.copyfile(src, dest / f"{arch}_{name}")
                copied.append(f"{arch}_{name}")
    return copied


# ----- the command --------------------------------------------------------------------------------


def child(part: str, scale: Scale, layout: Layout, out: Path, sequential: bool) -> int:
    def emit(result: dict[str, Any]) -> None:
        atomic_write_text(out, json_text(result) + "\n")

    if part == "train":
        return train_both(scale, layout, sequential)
    if part == "suite":
        suite(scale, layout, emit)
        return 0
    raise ConfigError(f"unknown part {part!r}")


def summary_lines(report: dict[str, Any]) -> list[str]:
    parts, found = report["parts"], report["finding"]
    lines = [f"{name}: {r['status']} in {r['seconds']:.0f} s" for name, r in parts.items()]
    corpus = (parts.get("corpus") or {}).get("result") or {}
    if corpus.get("unique_tokens"):
        lines.append(f"  corpus: {corpus['documents']:,} documents, {corpus['unique_tokens']:,} "
                     f"unique tokens, {corpus['bytes'] / 2**20:,.0f} MiB")  # fmt: skip
    for arch, r in ((parts.get("train") or {}).get("result") or {}).items():
        tps = r["tokens_per_s"]
        lines.append(f"  {arch}: {r['tokens_read']:,} tokens in {r['steps']} steps, "
                     f"{'n/a' if tps is None else f'{tps:,.0f}'} tokens/s")  # fmt: skip
    target = found["sink_target"]
    verdict = {True: "met", False: "MISSED", None: "not measured"}[target["met"]]
    lines.append(f"  Baseline Sink^0.3 over the last {target['min_over_last']} evaluations: "
                 f"{found['baseline_sink03_last_evals']} (target >= {target['at_least']}: "
                 f"{verdict})")  # fmt: skip
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = OneLineParser("lm_pair", prog="python -m gpu.lm_pair", description=__doc__.splitlines()[0])
    p.add_argument("--simulate", action="store_true", help="every part at tiny scale on the CPU")
    p.add_argument("--sequential", action="store_true", help="train one model after the other")
    p.add_argument("--dry-run", action="store_true", help="print the plan; run nothing")
    p.add_argument("--work", type=Path, default=Path("/tmp/smelt-lm-pair"), help="scratch folder")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--collect", type=Path, help="copy the metrics logs (and small checkpoints)")
    p.add_argument("--part", help=argparse.SUPPRESS)  # internal: run one part in this process
    p.add_argument("--part-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    scale, layout = (SIMULATE if args.simulate else DEVICE), Layout(args.work)
    try:
        if args.part:
            if args.part_out is None:
                raise ConfigError("--part needs --part-out PATH (it is run by lm_pair itself)")
            return child(args.part, scale, layout, args.part_out, args.sequential)
        check_outputs({}, {"--out": args.out})
        parts = default_parts(scale, layout, args.simulate, args.sequential)
        if args.dry_run:
            print("\n".join(plan_lines("lm_pair", parts, args.out)))
            return 0
        import torch

        if not args.simulate and not torch.cuda.is_available():
            raise ConfigError("no CUDA device here; it needs one GPU (--simulate runs on the CPU)")
        if layout.work.exists() and any(layout.work.iterdir()):
            raise ConfigError(f"--work {layout.work} is not empty; give a new folder")
    except SmeltError as exc:
        print(f"lm_pair: {exc}", file=sys.stderr)
        return 2
    layout.work.mkdir(parents=True, exist_ok=True)
    header = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if scale.device == "cuda" else "cpu (simulated)",
        "torch": torch.__version__,
        "simulate": args.simulate,
        "preset": scale.preset,
        "concurrent": not args.sequential,
    }
    print(f"lm_pair on {header['device']}, torch {header['torch']}", flush=True)
    report = run_parts(parts, args.out, header, runner=_train_runner(layout), tag="smelt-lm-pair")
    report["finding"] = finding(report)
    if args.collect is not None:
        report["collected"] = collect(layout, args.collect)
    if args.out is not None:
        atomic_write_text(args.out, json_text(report) + "\n")
    print("\n".join(["== summary", *summary_lines(report)]))
    return 0 if all(r["status"] == "ok" for r in report["parts"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
