"""gpu.check without a GPU: the dry-run plan, the one-line exit 2 without CUDA,
`--only` parsing, parts run under deadlines (a fake part that hangs is killed and recorded as a
timeout, the next part still runs), the JSON results file, the MFU arithmetic against a hand
count, and the train and sink parts' plumbing on CPU at tiny sizes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.wheels import run_device_script

from benchmarks import gpu_train
from gpu import check as gpu_check
from smelt_interp.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def test_dry_run_prints_the_plan_in_run_order(capsys) -> None:
    assert gpu_check.main(["--dry-run", "--only", "train,tests", "--out", "r.json"]) == 0
    out = capsys.readouterr().out
    assert "2 part(s), at most 360 s" in out  # 60 + 300
    assert out.index("  tests deadline") < out.index("  train deadline")
    assert "  sink " not in out
    assert "SMELT_CUDA_TESTS_DEVICE=cuda" in out and "tests/gpu/test_cuda.py" in out
    assert "target >= 35% Baseline" in out and "results JSON: r.json" in out
    assert not Path("r.json").exists()  # nothing ran, nothing written


def test_device_script_installs_the_wheels_then_runs_the_check_from_the_checkout(
    tmp_path: Path,
) -> None:
    """gpu/check_on_device.sh (an offline GPU machine): the wheels in SMELT_WHEELS are
    installed into SMELT_SITE with no index, and the check runs from this checkout with its JSON
    under $OUT (a stand-in wheel; --dry-run, so no GPU is needed)."""
    run, site, out = run_device_script(
        ROOT / "gpu" / "check_on_device.sh", tmp_path, "smelt_probe_marker", "--dry-run"
    )
    assert run.returncode == 0, run.stderr
    assert (site / "smelt_probe_marker" / "__init__.py").exists()
    assert f"results JSON: {out / 'gpu_check.json'}" in run.stdout
    assert "gpu_check plan: 3 part(s)" in run.stdout
    assert run.stdout.splitlines()[0].startswith(f"torch {torch.__version__}, CUDA ")


def test_full_plan_fits_seven_minutes(capsys) -> None:
    """Seven minutes of parts leave one of the device script's eight for the install."""
    assert gpu_check.main(["--dry-run"]) == 0
    total = sum(p.deadline_s for p in gpu_check.default_parts().values())
    assert total <= 420
    assert f"at most {total:.0f} s" in capsys.readouterr().out


def test_without_cuda_exits_2_with_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "no CUDA device" in captured.err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_cli_without_cuda_exits_2_without_traceback() -> None:
    proc = subprocess.run(
        [PY, "-m", "gpu.check", "--only", "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


def test_tests_part_runs_the_cuda_tests_on_cpu_with_the_override(tmp_path: Path) -> None:
    """The check's tests part, as gpu_check runs it, with the device override set to cpu: the
    CUDA-only checks' logic passes here (bf16 autocast, bf16 grouped_mm and the CPU flash
    kernel), so a broken check is caught before it reaches a GPU."""
    part = gpu_check.default_parts()["tests"]
    part.env = {"SMELT_CUDA_TESTS_DEVICE": "cpu"}
    record = gpu_check.run_part(part, tmp_path / "r.json", echo=False)
    assert record["status"] == "ok", record["log_tail"]
    summary = record["result"]
    assert summary["passed"] >= 11 and "skipped" not in summary and "failed" not in summary


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip without a GPU")
def test_tests_part_fails_when_every_cuda_test_skips(tmp_path: Path) -> None:
    """Without CUDA the CUDA-only tests skip (pytest exits 0); the check must not call that ok."""
    record = gpu_check.run_part(gpu_check.default_parts()["tests"], tmp_path / "r", echo=False)
    assert record["returncode"] == 0 and record["result"]["skipped"] >= 11
    assert record["status"] == "failed"


def test_only_parsing(capsys) -> None:
    assert gpu_check.parse_only(None) == ["tests", "sink", "train"]
    assert gpu_check.parse_only("train, tests") == ["tests", "train"]  # run order, not typed
    assert gpu_check.parse_only("sink,sink") == ["sink"]
    for bad in ("", ",", "gpu", "tests,gpu"):
        with pytest.raises(ConfigError, match="--only takes"):
            gpu_check.parse_only(bad)
    assert gpu_check.main(["--only", "tests,nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_check: --only takes") and err.count("\n") == 1


def test_unknown_flag_gives_one_line_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(["--bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == "gpu_check: unrecognized arguments: --bogus\n"


def _fake(name: str, code: str, deadline: float = 30) -> gpu_check.Part:
    """A part that runs `code` in a fresh Python; sys.argv[1] is its result path."""
    return gpu_check.Part(name, deadline, [PY, "-c", code, gpu_check.OUT_TOKEN], f"fake {name}")


WRITE = "import json, sys; open(sys.argv[1], 'w').write(json.dumps({'x': %d}))"


def test_parts_timeouts_failures_and_json(tmp_path: Path, capsys) -> None:
    out = tmp_path / "results" / "r.json"
    parts = [
        _fake("ok", WRITE % 1 + "; print('hello')"),
        _fake("hang", WRITE % 2 + "; import time; time.sleep(60)", deadline=1.5),
        _fake("crash", "raise SystemExit(3)"),
        _fake("after", WRITE % 4),
    ]
    report = gpu_check.run_parts(parts, out, {"device": "fake"}, echo=False)
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(report))
    got = {name: (r["status"], r["returncode"], r["result"]) for name, r in saved["parts"].items()}
    assert got == {
        "ok": ("ok", 0, {"x": 1}),
        "hang": ("timeout", -9, {"x": 2}),  # killed by SIGKILL; its partial result is kept
        "crash": ("failed", 3, None),
        "after": ("ok", 0, {"x": 4}),  # the parts after a timeout and a failure still ran
    }
    assert saved["parts"]["ok"]["log_tail"] == ["hello"]
    assert "killed at its deadline of 2 s" in saved["parts"]["hang"]["log_tail"][-1]
    assert saved["device"] == "fake"
    assert sorted(p.name for p in out.parent.iterdir()) == ["r.json"]  # no temp file left
    printed = capsys.readouterr().out
    assert "== hang: timeout" in printed and "== after: ok" in printed


def test_tests_part_reads_pytest_counts() -> None:
    lines = ["....", "==== 9 passed, 2 skipped, 1 error in 3.10s ===="]
    assert gpu_check.pytest_summary(lines) == {
        "line": "9 passed, 2 skipped, 1 error in 3.10s",
        "passed": 9,
        "skipped": 2,
        "errors": 1,
    }
    assert gpu_check.pytest_summary(["no summary"]) == {}


def test_mfu_against_hand_count() -> None:
    # 400k tokens/s x 6e8 FLOPs/token = 2.4e14 FLOP/s against 800 TFLOP/s: 30%.
    assert gpu_train.mfu(400_000, 6e8, 800.0) == pytest.approx(0.30, rel=1e-12)


def test_train_part_on_cpu_mfu_and_ratio() -> None:
    """dyck-pair-tiny Baseline: per token, forward FLOPs = 2 x active matmul weights + 4 x
    layers x (heads x d_head) x seq_len (scores and mixing, full context) + 2 x d_model x vocab.
    Per layer: W_q 64x64, W_k 64x32, W_v 64x32, W_o 64x64 (12,288), router 64x4 (256), two
    active SwiGLU experts 2 x 3 x 64x64 (24,576); four layers; unembedding 64 x 259. MFU is
    against the datasheet peak given, the second figure against the measured one."""
    per_layer = 2 * (12_288 + 256 + 24_576) + 4 * 64 * 128
    forward = 4 * per_layer + 2 * 64 * 259
    emitted: list[dict] = []
    r = gpu_check.train_part(
        emitted.append,
        preset="dyck-pair-tiny",
        rounds=2,
        steps_per_round=1,
        warmup=1,
        budget_s=120,
        device="cpu",
        compile_model=False,
        peak_tflops=0.5,
        datasheet_tflops=2.0,
    )
    b, s = r["models"]["baseline"], r["models"]["smelt"]
    assert b["train_flops_per_token"] == 3 * forward
    for m in (b, s):
        assert m["steps"] == 2 and m["tokens"] == 2 * 8 * 128 and not m["truncated"]
        assert m["tokens_per_s"] == pytest.approx(m["tokens"] / m["seconds"])
        assert m["mfu"] == pytest.approx(m["tokens_per_s"] * m["train_flops_per_token"] / 2e12)
        assert m["mfu_measured_peak"] == pytest.approx(4 * m["mfu"])
        assert len(m["round_tokens_per_s"]) == 2 and m["compile_fallback"] is None
    assert r["smelt_over_baseline"] == pytest.approx(s["tokens_per_s"] / b["tokens_per_s"])
    assert len(r["round_ratios"]) == 2
    assert len(emitted) == 2 and emitted[-1] is r  # after the peak, then every figure
    lines = "\n".join(gpu_check.summary_lines({"parts": {"train": {"status": "ok", "result": r}}}))
    assert "Baseline MFU" in lines and "target >= 35%" in lines and "target >= 0.95" in lines
    assert "of the datasheet peak" in lines


def test_datasheet_peak_is_the_h200s_dense_bf16() -> None:
    assert gpu_train.H200_DENSE_BF16_TFLOPS == 989.0


@pytest.mark.parametrize("how", ["fails", "overruns"])
def test_compile_falls_back_to_eager_with_the_reason(monkeypatch, capsys, how) -> None:
    """A compile that raises, or runs past its share of the budget (interrupted by the alarm),
    is dropped: the model is rebuilt eager, trained and measured, and the record and the
    printed line say why."""
    from smelt_interp.model.transformer import SmeltModel

    def broken(self, **options):
        if how == "fails":
            raise RuntimeError("inductor said no")
        time.sleep(30)

    monkeypatch.setattr(SmeltModel, "compile_blocks", broken)
    cfg = gpu_train.preset_config("dyck-pair-tiny", "baseline", True, "cpu")
    r = gpu_train.measure(cfg, steps=1, warmup=1, compile_budget_s=1.0)
    want = "RuntimeError: inductor said no" if how == "fails" else "CompileTimeout: compiling"
    assert r["compile_fallback"].startswith(want)
    assert r["compile"] is False and r["steps"] == 1 and r["tokens_per_s"] > 0
    assert "compile dropped, running eager" in capsys.readouterr().out


def test_compile_seconds_are_reported_apart_from_step_time(monkeypatch) -> None:
    """The first step carries the compile (here a stand-in that takes 1 s, then dynamo's eager
    backend): `compile_s` holds it, and the timed steps' tokens/s does not."""
    from smelt_interp.model.transformer import SmeltModel

    real = SmeltModel.compile_blocks

    def slow(self, **options):
        time.sleep(1.0)
        real(self, backend="eager")

    monkeypatch.setattr(SmeltModel, "compile_blocks", slow)
    cfg = gpu_train.preset_config("dyck-pair-tiny", "baseline", True, "cpu")
    r = gpu_train.measure(cfg, steps=2, warmup=2)
    assert r["compile"] is True and r["compile_fallback"] is None
    assert r["compile_s"] >= 1.0 and r["seconds"] / r["steps"] < r["compile_s"]


def test_measure_stops_at_its_deadline() -> None:
    cfg = gpu_train.preset_config("dyck-pair-tiny", "baseline", False, "cpu")
    r = gpu_train.measure(cfg, steps=5, warmup=1, deadline=0.0)  # already past
    assert r["steps"] == 0 and r["warmup_steps"] == 0 and r["truncated"]
    assert r["tokens_per_s"] is None


def test_summary_marks_targets() -> None:
    def model(tps: float, mfu: float) -> dict:
        return {"tokens_per_s": tps, "mfu": mfu, "steps": 20, "warmup_s": 1.0, "truncated": False}

    result = {
        "peak_tflops": 800.0,
        "models": {"baseline": model(1e6, 0.30), "smelt": model(0.97e6, 0.29)},
        "smelt_over_baseline": 0.97,
    }
    lines = gpu_check.summary_lines({"parts": {"train": {"status": "ok", "result": result}}})
    assert any("Baseline MFU 30.0% (target >= 35%: MISSED)" in x for x in lines)
    assert any("SMELT / Baseline tokens/s 0.970 (target >= 0.95: met)" in x for x in lines)
    failed = {"status": "timeout", "result": None}
    lines = gpu_check.summary_lines({"parts": {"train": failed, "sink": failed}})
    assert "train: timeout" in lines[1] and "not measured" in lines[-1]


def test_sink_part_on_cpu_reports_each_length() -> None:
    fields = dict(
        d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_head=8, n_experts=4, top_k=2,
        d_expert=16,
    )  # fmt: skip
    emitted: list[dict] = []
    r = gpu_check.sink_part((96, 160), emitted.append, model_fields=fields, device="cpu", chunk=32)
    assert list(r["lengths"]) == ["96", "160"]  # the warm-up call is not reported
    assert r["model"]["max_seq_len"] == 160 and r["chunk"] == 32
    for t, row in r["lengths"].items():
        assert row["heads"] == 6 * 4 and row["finite"]
        # uniform attention's BOS mass: mean over queries i >= 1 of 1 / (i + 1)
        n = int(t)
        assert row["uniform_mass"] == pytest.approx(sum(1 / (i + 1) for i in range(1, n)) / (n - 1))
    assert len(emitted) == 2
