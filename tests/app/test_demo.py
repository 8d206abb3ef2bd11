"""`make demo` serves first and trains in the background (smelt_interp.app.jobs): the demo
target's own command, run where no pair is trained and with the trainer replaced by a
long-running stub (SMELT_TRAINER), answers HTTP 200 within 30 s while the stub runs as the
Baseline's job (`--resume`, log in its run folder) and SMELT's waits queued; Ctrl-C (SIGINT to
the server) ends the server and leaves no trainer process behind. JobRunner escalates to
SIGTERM for a trainer that ignores SIGINT, and runs its jobs one at a time."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import psutil
import pytest
from helpers.browser import free_port, wait_for, wait_until_serving

from smelt_interp.app.jobs import JobRunner, TrainJob
from smelt_interp.train.progress import read_job, run_progress

REPO = Path(__file__).resolve().parents[2]
FIRST_ANSWER_S = 30.0

STUB = """
import json, os, sys, time
out = os.path.join(os.environ["STUB_OUT"], f"{os.getpid()}.json")
with open(out, "w") as fh:
    json.dump(sys.argv[1:], fh)
print("stub trainer started", flush=True)
time.sleep(600)
"""


PREPARE_STUB = (
    "import json, os, sys, time; "
    "json.dump(sys.argv[1:], open(os.environ['PREPARE_OUT'], 'w')); time.sleep(600)"
)


def demo_command(port: int) -> list[str]:
    """The demo target's recipe as make would run it (its install prerequisite taken as done),
    with this test's Python as the venv's."""
    out = subprocess.run(
        [
            "make",
            "-s",
            "-n",
            "-f",
            str(REPO / "Makefile"),
            "-o",
            ".venv/.installed",
            "demo",
            f"BIN={Path(sys.executable).parent}",
            f"DEMO_ARGS=--port {port}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert len(out.splitlines()) == 1, out
    return shlex.split(out)


def ignore_sigint_in_child() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_demo(
    tmp_path: Path, port: int, ignore_sigint: bool = False
) -> tuple[subprocess.Popen, Path]:
    """The demo on a stub trainer; with `ignore_sigint`, started as a script's `cmd &` starts
    it, with SIGINT ignored."""
    stub = tmp_path / "stub_trainer.py"
    stub.write_text(textwrap.dedent(STUB))
    marks = tmp_path / "stub_runs"
    marks.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "SMELT_TRAINER": f"{shlex.quote(sys.executable)} {shlex.quote(str(stub))}",
        "STUB_OUT": str(marks),
        # the real model's preparation: a stub that records its arguments and waits
        "SMELT_REAL_LM": f"{shlex.quote(sys.executable)} -c {shlex.quote(PREPARE_STUB)}",
        "PREPARE_OUT": str(tmp_path / "prepare.json"),
    }
    work = tmp_path / "clone"  # no runs/ yet: nothing is trained
    work.mkdir()
    proc = subprocess.Popen(
        demo_command(port),
        cwd=work,
        env=env,
        stdout=open(tmp_path / "demo.log", "wb"),
        stderr=subprocess.STDOUT,
        preexec_fn=ignore_sigint_in_child if ignore_sigint else None,
    )
    return proc, work


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def demo(tmp_path, request):
    port = free_port()
    proc, work = start_demo(tmp_path, port, ignore_sigint=getattr(request, "param", False))
    try:
        yield proc, work, port, tmp_path
    finally:
        stop(proc)
        for child in psutil.Process().children(recursive=True):
            child.kill()


def test_make_demo_answers_first_while_the_pair_trains_in_the_background(demo):
    proc, work, port, tmp = demo
    wait_until_serving(proc, f"http://127.0.0.1:{port}/", FIRST_ANSWER_S, tmp / "demo.log")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/runs", timeout=5) as resp:
        assert resp.status == 200
    marks = wait_for(lambda: list((tmp / "stub_runs").glob("*.json")))
    assert len(marks) == 1  # one job at a time
    args = json.loads(marks[0].read_text())
    assert args == ["--preset", "recall-pair", "--arch", "baseline", "--out"] + [
        str(Path("runs") / "recall-pair"),
        "--resume",
        "--quiet",
    ]
    pair = work / "runs" / "recall-pair"
    for later in (pair / "smelt", work / "runs" / "dyck-pair" / "baseline"):
        assert read_job(later)["state"] == "queued"  # the recall pair first, then the Dyck pair
    assert (pair / "baseline" / "train.log").exists()
    job = wait_for(lambda: read_job(pair / "baseline").get("state") == "running")
    assert job
    # the job's pid is the trainer's keeper, which leads the trainer's process group
    assert read_job(pair / "baseline")["pid"] == os.getpgid(int(marks[0].stem))
    assert run_progress(pair / "baseline").state == "training"
    assert read_job(pair / "smelt")["state"] == "queued"
    assert run_progress(pair / "smelt").state == "queued"
    assert "stub trainer started" in wait_for(lambda: (pair / "baseline" / "train.log").read_text())
    text = (tmp / "demo.log").read_text()
    assert f"http://127.0.0.1:{port}/" in text and "training in the background" in text
    # the real model is prepared beside the training, not after it, into models/
    prepare = json.loads(wait_for(lambda: (tmp / "prepare.json").read_text()))
    assert prepare == ["--out", str(Path("models") / "smollm2-135m")]
    assert read_job(work / "runs" / "real-lm")["state"] == "running"
    assert read_job(pair / "baseline")["state"] == "running"
    assert "preparing the real model (smollm2-135m)" in text


@pytest.mark.parametrize("demo", [False, True], ids=["", "sigint-inherited-ignored"], indirect=True)
def test_ctrl_c_stops_the_server_and_leaves_no_trainer(demo):
    proc, work, port, tmp = demo
    wait_until_serving(proc, f"http://127.0.0.1:{port}/", 120.0, tmp / "demo.log")
    marks = wait_for(lambda: list((tmp / "stub_runs").glob("*.json")))
    trainer = int(marks[0].stem)
    assert not gone(trainer)
    proc.send_signal(signal.SIGINT)
    proc.wait(120)  # the server exits (werkzeug turns the interrupt into a normal return)
    assert gone(trainer)
    pairs = ("recall-pair", "dyck-pair")
    runs = [work / "runs" / pair / arch for pair in pairs for arch in ("baseline", "smelt")]
    assert [read_job(run)["state"] for run in runs] == ["stopped"] * 4
    assert read_job(work / "runs" / "real-lm")["state"] == "stopped"
    assert read_job(runs[0])["returncode"] == -signal.SIGINT  # stopped at the first signal
    assert len(list((tmp / "stub_runs").glob("*.json"))) == 1  # the later jobs never started


def test_stop_escalates_for_a_trainer_that_ignores_sigint(tmp_path):
    ready = tmp_path / "ready"
    ignore = (
        "import pathlib, signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(600)"
    )
    runner = JobRunner([TrainJob(tmp_path / "a", ())], command=[sys.executable, "-c", ignore])
    runner.start()
    proc = wait_for(lambda: runner.current)
    wait_for(ready.exists)  # SIGINT before the handler is set would end it at once
    runner.stop(grace=0.5)
    assert proc.poll() == -signal.SIGTERM
    assert read_job(tmp_path / "a")["state"] == "stopped"


def test_jobs_run_one_after_another_and_record_how_they_ended(tmp_path):
    # each job marks its start and end; the second exits 9 if the first had not ended
    script = textwrap.dedent("""
        import os, sys, time
        own, before, code = sys.argv[1:]
        open(os.path.join(own, "start"), "w").close()
        if before and not os.path.exists(os.path.join(before, "end")):
            sys.exit(9)
        time.sleep(0.3)
        open(os.path.join(own, "end"), "w").close()
        sys.exit(int(code))
    """)
    ok, bad = tmp_path / "ok", tmp_path / "bad"
    jobs = [TrainJob(ok, (str(ok), "", "0")), TrainJob(bad, (str(bad), str(ok), "3"))]
    runner = JobRunner(jobs, command=[sys.executable, "-c", script]).start()
    wait_for(lambda: read_job(bad).get("state") in ("done", "failed"))
    runner.stop()
    assert (read_job(ok)["state"], read_job(ok)["returncode"]) == ("done", 0)
    assert (read_job(bad)["state"], read_job(bad)["returncode"]) == ("failed", 3)
    assert run_progress(bad).state == "failed"


@pytest.mark.slow
def test_a_stopped_job_resumes_where_the_trainer_checkpointed(tmp_path):
    """The real trainer as a job: stopped past its first checkpoint (step 40 of the tiny
    preset), the next runner's `--resume` continues from it, and the log's steps run on. The
    run is 400 steps, not the preset's 120: an idle machine trains the tiny model so fast that
    a 120-step run can finish between the stop being asked for and the trainer seeing it."""
    from smelt_interp.train.metrics import read_metrics

    run = tmp_path / "tiny" / "baseline"
    args = ("--preset", "dyck-pair-tiny", "--arch", "baseline", "--out", str(run.parent))
    job = TrainJob(
        run, (*args, "--resume", "--quiet", "--set", "threads=1", "--set", "steps=400"), 400
    )

    def steps() -> list[int]:
        path = run / "metrics.jsonl"
        records = read_metrics(path) if path.exists() else []
        return [r["step"] for r in records if r.get("event") == "train"]

    first = JobRunner([job]).start()
    wait_for(lambda: (run / "state.pt").exists() and steps() and steps()[-1] > 45, timeout=240)
    first.stop()
    stopped_at = steps()[-1]
    assert read_job(run)["state"] == "stopped"
    progress = run_progress(run)
    assert progress.state == "failed" and f"stopped at step {stopped_at} of 400" in progress.message
    assert (run / "train.log").read_text().rstrip().endswith("interrupted")

    second = JobRunner([job]).start()
    try:
        wait_for(lambda: read_job(run).get("state") == "done", timeout=240)
    finally:
        second.stop()
    assert steps() == list(range(1, 401))  # resumed at a checkpoint: each step logged once
    assert run_progress(run).state == "finished"


def test_the_demo_queues_the_unfinished_models_unless_another_trainer_has_the_pair(
    tmp_path, monkeypatch, tiny_model
):
    from smelt_interp.app.__main__ import default_pair
    from smelt_interp.checkpoint import save_checkpoint
    from smelt_interp.train.run_folder import RunFolder

    monkeypatch.chdir(tmp_path)
    paths, jobs = default_pair()
    recall, dyck = Path("runs") / "recall-pair", Path("runs") / "dyck-pair"
    queued = [recall / "baseline", recall / "smelt", dyck / "baseline", dyck / "smelt"]
    assert [job.run_dir for job in jobs] == queued  # the recall pair first
    assert [job.args[1] for job in jobs] == ["recall-pair"] * 2 + ["dyck-pair"] * 2
    assert all("--resume" in job.args for job in jobs)
    assert list(paths) == ["baseline-recall", "smelt-recall", "baseline", "smelt"]
    save_checkpoint(paths["baseline"], tiny_model, final=True)
    _, jobs = default_pair()
    assert [job.run_dir for job in jobs] == queued[:2] + queued[3:]
    with RunFolder(paths["smelt"].parent):  # `make train` has it: watch, do not start another
        assert [job.run_dir for job in default_pair()[1]] == queued[:2]
