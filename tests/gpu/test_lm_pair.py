"""gpu.lm_pair without a GPU: `--simulate` runs the device script's three parts at tiny scale on
the CPU (this machine's own text gathered into BPE shards, lm-pair-gpu-tiny's pair trained side
by side, the section-6 probes on both) and fills every key the device run fills; its figures are
checked against the files the parts wrote (the shards' manifest, the runs' metrics logs and
checkpoints). The plan fits the device call's 9 minutes; bad starts are one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.wheels import run_device_script

from gpu import lm_pair
from smelt_interp.checkpoint import read_info
from smelt_interp.data.bpe import checkpoint_tokenizer, tokenizer_hash, tokenizer_json
from smelt_interp.data.shards import ShardSet
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import get_preset

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> tuple[dict, Path, Path]:
    """One --simulate run: (its JSON, the work folder, the collected files' folder)."""
    tmp = tmp_path_factory.mktemp("lm_pair")
    work, out, collected = tmp / "work", tmp / "lm_pair.json", tmp / "collected"
    proc = subprocess.run(
        [PY, "-m", "gpu.lm_pair", "--simulate", "--work", str(work), "--out", str(out),
         "--collect", str(collected)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={"PATH": "/usr/bin:/bin", "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), work, collected


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_simulate_fills_every_key_the_device_run_fills(simulated):
    report, _, _ = simulated
    assert lm_pair.missing_keys(report) == []
    assert {name: r["status"] for name, r in report["parts"].items()} == dict.fromkeys(
        ("corpus", "train", "suite"), "ok"
    )
    assert report["simulate"] is True and report["preset"] == "lm-pair-gpu-tiny"


def test_the_corpus_is_this_machines_text_in_the_shards_the_models_read(simulated):
    report, work, _ = simulated
    corpus = report["parts"]["corpus"]["result"]
    shards = ShardSet(work / "shards")
    manifest = json.loads((work / "shards" / "manifest.json").read_text())
    assert corpus["unique_tokens"] == sum(s["tokens"] for s in manifest["shards"]) > 0
    assert corpus["documents"] == sum(s["docs"] for s in manifest["shards"])
    assert 0 < corpus["bytes"] <= lm_pair.SIMULATE.corpus_bytes
    assert set(corpus["domains"]) == set(shards.domains("train")) and len(corpus["domains"]) >= 2
    assert shards.tokenizer.vocab_size == lm_pair.SIMULATE.vocab_size
    for arch in lm_pair.ARCHS:
        info = read_info(work / "runs" / arch / "ckpt.pt")
        assert tokenizer_hash(tokenizer_json(checkpoint_tokenizer(info.meta))) == (
            shards.tokenizer_hash
        )


def test_the_training_record_is_what_the_runs_logged(simulated):
    report, work, _ = simulated
    cfg = TrainConfig.from_dict(get_preset("lm-pair-gpu-tiny"))
    for arch in lm_pair.ARCHS:
        r = report["parts"]["train"]["result"][arch]
        logged = _metrics(work / "runs" / arch)
        evals = [x for x in logged if x["event"] == "eval"]
        assert r["steps"] == cfg.schedule.steps
        assert r["tokens_read"] == cfg.schedule.steps * cfg.tokens_per_step
        assert r["tokens_per_s"] > 0
        assert [p["step"] for p in r["sink_curve"]] == [e["step"] for e in evals] == [10, 20, 30]
        for point, ev in zip(r["sink_curve"], evals):
            assert point["sink03_64"] == ev["sink03_64"]
            assert point["sink03_gu"] == ev["sink03_gu"]
            masses = {k.split("/")[1]: v for k, v in ev.items() if k.startswith("sink_mass/")}
            assert point["bos_mass"] == masses
        model = TrainConfig.from_dict({**get_preset("lm-pair-gpu-tiny"), "arch": arch})
        schedule = model.model_config().schedule  # every (layer, visit) once
        assert set(r["sink_curve"][-1]["bos_mass"]) == {f"{lay}.{vis}" for lay, vis in schedule}
    found = report["finding"]
    last = [e["sink03_gu"] for e in _metrics(work / "runs" / "baseline") if e["event"] == "eval"]
    assert found["baseline_sink03_last_evals"] == last[-3:]
    assert found["sink_target"]["met"] == (min(last[-3:]) >= 0.3)


def test_the_suite_probes_both_checkpoints(simulated):
    report, _, collected = simulated
    suite = report["parts"]["suite"]["result"]
    assert set(suite["models"]) == set(lm_pair.ARCHS)
    probes = suite["probes"]
    assert list(probes) == list(lm_pair.SUITE)
    case = probes["case_study"]
    assert case["skipped"] == {}
    visits = {(r["model"], r["layer"], r["visit"]) for r in case["tables"]["visits"]}
    assert ("smelt", 1, 1) in visits and ("baseline", 1, 0) in visits
    assert {r["model"] for r in case["tables"]["visit_diff"]} == {"smelt"}
    assert probes["routing"]["skipped"].keys() == {"baseline"}  # a Baseline has one visit
    cos = [r for r in probes["similarity"]["summary"] if r["statistic"].startswith("cos_v (")]
    assert cos and -1 <= cos[0]["smelt"] <= 1
    assert report["finding"]["case_study_summary"] == case["summary"]
    for arch in lm_pair.ARCHS:  # tiny checkpoints come back; the logs always do
        assert (collected / f"{arch}_metrics.jsonl").is_file()
        assert (collected / f"{arch}_ckpt.pt").is_file()
    assert sorted(report["collected"]) == sorted(p.name for p in collected.iterdir())


def test_the_device_plan_fits_nine_minutes(capsys):
    assert lm_pair.main(["--dry-run"]) == 0
    total = sum(lm_pair.DEVICE.deadlines.values())
    assert total <= 520 and f"at most {total:.0f} s" in capsys.readouterr().out
    script = (ROOT / "gpu" / "lm_pair_on_device.sh").read_text()
    assert "timeout --signal=KILL 530" in script  # the parts' 520 s, then the wrapper's cut-off
    cfg = TrainConfig.from_dict(get_preset("lm-pair-gpu"))
    assert cfg.schedule.steps * cfg.tokens_per_step >= 500_000_000
    for arch in lm_pair.ARCHS:
        model = TrainConfig.from_dict({**get_preset("lm-pair-gpu"), "arch": arch}).model_config()
        assert model.n_heads >= 8


def test_bad_starts_are_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert lm_pair.main(["--work", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device" in err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "left.txt").write_text("x")
    assert lm_pair.main(["--simulate", "--work", str(tmp_path / "busy")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not empty" in err
    assert (tmp_path / "busy" / "left.txt").read_text() == "x"


def test_finding_and_missing_keys_by_hand():
    def report(curve):
        train = {"baseline": {"sink_curve": curve}}
        return {"parts": {"train": {"result": train}, "suite": {"result": None}}}

    point = lambda s: {"tokens": 1, "sink03_gu": s, "sink03_64": 0.0, "bos_mass_mean": 0.1}  # noqa: E731
    assert lm_pair.finding(report([point(0.5), point(0.3), point(0.4)]))["sink_target"]["met"]
    assert not lm_pair.finding(report([point(0.9), point(0.29), point(0.9), point(0.9)]))[
        "sink_target"
    ]["met"]
    assert lm_pair.finding(report([point(0.9), point(0.9)]))["sink_target"]["met"] is None
    missing = lm_pair.missing_keys({"device": "x", "torch": "y", "preset": "p", "finding": {}})
    assert "device" not in missing and "finding.baseline_onset" in missing
    assert len(missing) == len(lm_pair.FILLED_KEYS) - 3


def test_collect_leaves_out_files_over_the_return_limit(tmp_path):
    layout = lm_pair.Layout(tmp_path / "work")
    for arch in lm_pair.ARCHS:
        layout.run(arch).mkdir(parents=True)
        (layout.run(arch) / "metrics.jsonl").write_text("{}\n")
    with open(layout.run("smelt") / "ckpt.pt", "wb") as fh:
        fh.truncate(lm_pair.RETURN_LIMIT_BYTES)  # at the limit: too big to come back
    (layout.run("baseline") / "ckpt.pt").write_bytes(b"small")
    got = lm_pair.collect(layout, tmp_path / "back")
    assert sorted(got) == ["baseline_ckpt.pt", "baseline_metrics.jsonl", "smelt_metrics.jsonl"]


def test_device_script_installs_the_wheels_then_plans_the_run(tmp_path):
    """gpu/lm_pair_on_device.sh: the carried wheels installed with no index (a stand-in wheel),
    then gpu.lm_pair from this checkout with its JSON under $OUT (--dry-run: no GPU needed)."""
    run, site, out = run_device_script(
        ROOT / "gpu" / "lm_pair_on_device.sh", tmp_path, "smelt_lm_marker", "--dry-run"
    )
    assert run.returncode == 0, run.stderr
    assert (site / "smelt_lm_marker" / "__init__.py").exists()
    assert f"results JSON: {out / 'lm_pair.json'}" in run.stdout
    assert "lm_pair plan: 3 part(s)" in run.stdout
