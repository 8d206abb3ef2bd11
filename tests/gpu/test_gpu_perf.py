"""benchmarks.gpu_perf without a GPU: `--smoke` runs every part on the CPU at tiny sizes and
fills every key the device run fills (a CUDA-only figure null with its reason); the plan fits
the device call's 9 minutes; the device script installs the wheels and runs it from the
checkout; bad starts are one line; the profile's categories and busy-time arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.wheels import run_device_script

from benchmarks import gpu_perf, perf_parts

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_perf") / "gpu_perf.json"
    proc = subprocess.run(
        [PY, "-m", "benchmarks.gpu_perf", "--smoke", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_smoke_fills_every_key_the_device_run_fills(smoke) -> None:
    assert gpu_perf.missing_keys(smoke) == []
    assert {n: r["status"] for n, r in smoke["parts"].items()} == dict.fromkeys(
        gpu_perf.DEADLINES, "ok"
    )
    assert smoke["smoke"] is True


def test_smoke_figures_are_the_measured_ones(smoke) -> None:
    parts = {name: r["result"] for name, r in smoke["parts"].items()}
    for arch in gpu_perf.ARCHS:
        attention = parts["attention"]["models"][arch]
        assert attention["default_backend"] in ("flash", "math")
        assert attention["backends"]["math"]["tflops"] > 0  # the CPU's reference backend
        assert "skipped" in attention["backends"]["cudnn"]
        profile = parts["profile"]["models"][arch]
        assert profile["categories"]["grouped_gemm"]["seconds"] > 0
        assert profile["categories"]["attention"]["seconds"] > 0
        assert 0 < len(profile["top_kernels"]) <= 15
        assert sum(c["share"] for c in profile["categories"].values()) == pytest.approx(1.0)
        ab = parts["ab"]["models"][arch]
        assert set(ab["variants"]) == set(perf_parts.VARIANTS)
        assert ab["variants"]["current"]["speedup_vs_current"] == 1.0
        assert all(len(v["round_tokens_per_s"]) == ab["rounds"] for v in ab["variants"].values())
    assert set(parts["ab"]["smelt_over_baseline"]) == set(perf_parts.VARIANTS)


def test_a_missing_or_unexplained_null_is_reported(smoke) -> None:
    broken = json.loads(json.dumps(smoke))
    env = broken["parts"]["env"]["result"]
    del env["null_reasons"]["gpu"]
    del broken["parts"]["ab"]["result"]["models"]["smelt"]["variants"]["all"]["mfu"]
    assert gpu_perf.missing_keys(broken) == ["env.gpu", "ab.models.smelt.variants.all.mfu"]


def test_plan_fits_the_device_call(capsys) -> None:
    assert gpu_perf.main(["--dry-run", "--out", "r.json"]) == 0
    out = capsys.readouterr().out
    total = sum(gpu_perf.DEADLINES.values())
    assert total <= 480  # 9 minutes less the install and the 530 s kill
    assert f"gpu_perf plan: 5 part(s), at most {total} s" in out
    assert out.index("  env ") < out.index("  attention ") < out.index("  ab ")
    assert not Path("r.json").exists()


def test_bad_starts_are_one_line(capsys) -> None:
    assert gpu_perf.main(["--only", "env,nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_perf: --only takes") and err.count("\n") == 1
    with pytest.raises(SystemExit):
        gpu_perf.main(["--bogus"])
    assert capsys.readouterr().err.startswith("gpu_perf: unrecognized arguments")


def test_device_script_installs_the_wheels_then_runs_from_the_checkout(tmp_path) -> None:
    run, site, out = run_device_script(
        ROOT / "gpu" / "perf_on_device.sh", tmp_path, "smelt_probe_marker", "--dry-run"
    )
    assert run.returncode == 0, run.stderr
    assert (site / "smelt_probe_marker" / "__init__.py").exists()
    assert f"results JSON: {out / 'gpu_perf.json'}" in run.stdout


def test_kernel_categories_and_busy_time() -> None:
    names = {
        "void flash_fwd_kernel<...>": "attention",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop": "attention",
        "_grouped_mm_kernel": "grouped_gemm",
        "sm90_xmma_gemm_bf16bf16_bf16f32": "dense_gemm",
        "at::native::radixSortKVInPlace": "permutation",
        "index_select_kernel": "permutation",
        "rms_norm_kernel": "norms_pointwise",
        "triton_poi_fused_mul_silu_0": "norms_pointwise",
        "multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
        "Memcpy DtoD": "other",
    }
    assert {n: perf_parts.category(n) for n in names} == names
    rows = [("a", 0, 0.0, 10.0), ("b", 0, 5.0, 12.0), ("c", 0, 20.0, 25.0)]
    assert perf_parts._busy(rows) == 17.0  # 0..12 and 20..25
