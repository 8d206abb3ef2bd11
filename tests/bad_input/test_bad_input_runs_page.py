"""Bad input on the dashboard's Runs page and its trainer: the page reads a log's tail in
bounded work and outside any lock another user waits on, never shows a file a link points to
outside its run folder, does not search its root on every refresh, shows an absurd step as
unknown and skips a line nested too deep to parse; SMELT_TRAINER that is no command line is one
line; the background trainer is stopped with its whole process group, also when the server is
killed.

Every wait here is bounded (a join, a subprocess or poll timeout)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.runs_bench import make_client
from smelt_interp.app.jobs import JobRunner, TrainJob
from smelt_interp.app.pages import run_watch
from smelt_interp.app.pages import runs as runs_page
from smelt_interp.train import progress
from smelt_interp.train.progress import MetricsTail, run_progress

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 60.0


def train_line(step, tokens=None) -> str:
    tokens = 64 * step if tokens is None and isinstance(step, int) else tokens
    rec = {"event": "train", "step": step, "tokens": tokens, "tokens_per_s": 500.0, "loss": 1.0}
    return json.dumps(rec) + "\n"


def wait_for(check, timeout: float = WAIT_S, every: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(every)
    return check()


def table_rows(response) -> dict[str, list]:
    table = response[runs_page.TABLE]["children"]
    body = table["props"]["children"][1]["props"]["children"]
    out = {}
    for tr in body:
        cells = [td["props"]["children"] for td in tr["props"]["children"]]
        out[cells[0]] = [cells[1]["props"]["children"], *cells[2:]]
    return out


@pytest.fixture
def refresh(tmp_path):
    """refresh() -> the Runs refresh callback's response for a dashboard watching tmp/runs."""
    (tmp_path / "runs").mkdir()
    call, _ = make_client(tmp_path / "runs")
    return lambda: call(None)[1]


# ----- a long log's first read is bounded -----------------------------------------------------
class CountingReads:
    """Wraps progress._open_log: counts the bytes read through the files it opens."""

    def __init__(self, monkeypatch) -> None:
        self.bytes = 0
        real = progress._open_log
        counter = self

        class Counted:
            def __init__(self, fh) -> None:
                self.fh = fh

            def read(self, n=-1):
                data = self.fh.read(n)
                counter.bytes += len(data)
                return data

            def __getattr__(self, name):
                return getattr(self.fh, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.fh.close()

        monkeypatch.setattr(progress, "_open_log", lambda path: Counted(real(path)))


@pytest.mark.parametrize(
    "head",
    ["sparse-zeros", "sparse-then-newline", "one-long-line"],
)
def test_a_huge_logs_first_read_reads_only_its_end(tmp_path, monkeypatch, head):
    monkeypatch.setattr(progress, "FIRST_READ_BYTES", 1 << 20)
    monkeypatch.setattr(progress, "READ_BUDGET", 1 << 20)
    path = tmp_path / "metrics.jsonl"
    size = 2 << 30  # sparse: no disk used; a whole read would take ~10 s and read 2 GiB
    with open(path, "wb") as fh:
        if head == "one-long-line":
            fh.write(b"x" * 4096)
        fh.truncate(size)
        fh.seek(size)
        if head == "sparse-then-newline":
            fh.write(b"\n")
        fh.write("".join(train_line(s) for s in range(1, 101)).encode())
    counted = CountingReads(monkeypatch)
    tail = MetricsTail(path)
    records = tail.read()
    assert counted.bytes <= (1 << 20) + 1  # the end only (and one byte before it)
    # the line the start fell in is cut (zeros then the first record): it is dropped whole
    first = 1 if head == "sparse-then-newline" else 2
    assert [r["step"] for r in records] == list(range(first, 101))
    assert tail.skipped == path.stat().st_size - (1 << 20)
    assert tail.read() == []  # caught up: nothing more to read
    with open(path, "a") as fh:
        fh.write(train_line(101))
    assert [r["step"] for r in tail.read()] == [101]


def test_a_long_append_is_read_over_several_refreshes(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "READ_BUDGET", 4096)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(train_line(s) for s in range(1, 501)))
    tail = MetricsTail(path)
    steps: list[int] = []
    for _ in range(100):
        got = tail.read()
        if not got and tail.offset == path.stat().st_size:
            break
        steps += [r["step"] for r in got]
    assert steps == list(range(1, 501))  # every record once, in order


@pytest.mark.parametrize("held", ["reader", "reader-and-refresh"])
def test_a_read_in_progress_holds_up_no_other_refresh(tmp_path, held):
    root = tmp_path / "runs"
    run = root / "slow"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(train_line(1))
    call, _ = make_client(root)
    call(None)
    tail = runs_page.WATCHER.tail(runs_page.WATCHER.run_dirs()[0])
    assert tail.lock.acquire(timeout=5)  # another user's read, stuck on a slow disk
    answers: list = []
    try:
        workers = [threading.Thread(target=lambda: answers.append(call(None)[1]), daemon=True)]
        if held == "reader-and-refresh":
            workers.append(
                threading.Thread(target=lambda: answers.append(tail.records("train")), daemon=True)
            )
        for w in workers:
            w.start()
        for w in workers:
            w.join(20)
        assert len(answers) == len(workers)  # answered while the read is still going
    finally:
        tail.lock.release()


# ----- no link out of a run folder is followed ----------------------------------------------
SECRET = "error: the-secret-contents-of-a-file-outside-runs"


def _link_out(run: Path, name: str, target: Path, how: str) -> None:
    link = run / name
    if how == "absolute":
        link.symlink_to(target)
    elif how == "relative":
        link.symlink_to(os.path.relpath(target, run))
    else:  # a chain: a link inside the folder to a link that leaves it
        (run / "inner").symlink_to(target)
        link.symlink_to("inner")


@pytest.mark.parametrize("how", ["absolute", "relative", "chain"])
def test_a_train_log_linked_out_of_runs_is_not_shown(tmp_path, refresh, how):
    secret = tmp_path / "secret.txt"
    secret.write_text(f"{SECRET}\n")
    run = tmp_path / "runs" / "stolen"
    run.mkdir()
    (run / "metrics.jsonl").write_text(train_line(1))
    progress.write_job(run, state="failed", owner=os.getpid(), returncode=2)
    _link_out(run, "train.log", secret, how)
    response = refresh()
    assert "the-secret-contents" not in json.dumps(response)
    assert "stolen" in table_rows(response)


@pytest.mark.parametrize("how", ["absolute", "relative", "chain"])
def test_a_metrics_log_linked_out_of_runs_is_not_read(tmp_path, refresh, how):
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text(train_line(7) + json.dumps({"event": "train", "step": 8, "x": SECRET}))
    run = tmp_path / "runs" / "stolen"
    run.mkdir()
    _link_out(run, "metrics.jsonl", outside, how)
    response = refresh()
    text = json.dumps(response)
    assert "the-secret-contents" not in text
    row = table_rows(response)["stolen"]
    assert row[1] == "–"  # no step read from the file outside
    assert "link out of the run folder" in row[-1]
    assert run_progress(run).step is None


@pytest.mark.parametrize("how", ["absolute", "relative", "chain"])
def test_a_job_record_linked_out_is_not_read(tmp_path, how):
    outside = tmp_path / "outside"
    outside.write_text(json.dumps({"state": "running", "pid": os.getpid(), "steps": 77}))
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(train_line(1))
    _link_out(run, "job.json", outside, how)
    p = run_progress(run)
    assert p.steps != 77 and p.state != "training"


# ----- the root is not searched on every refresh ----------------------------------------------
class CountingScans:
    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        real = os.scandir

        def scandir(path="."):
            self.calls += 1
            return real(path)

        monkeypatch.setattr(run_watch.os, "scandir", scandir)


@pytest.mark.parametrize("shape", ["wide", "deep"])
def test_a_root_of_many_empty_folders_is_searched_boundedly_and_rarely(
    tmp_path, monkeypatch, shape
):
    root = tmp_path / "runs"
    if shape == "wide":
        for i in range(1500):
            (root / f"empty{i:05d}").mkdir(parents=True)
    else:
        for i in range(40):
            for j in range(40):
                (root / f"a{i:02d}" / f"b{j:02d}").mkdir(parents=True)
    (root / "zz-run").mkdir()
    (root / "zz-run" / "metrics.jsonl").write_text(train_line(1))
    monkeypatch.setattr(run_watch, "SCAN_FOLDERS", 200)
    watcher = run_watch.RunsWatcher()
    watcher.watch([], root)
    scans = CountingScans(monkeypatch)
    watcher.poll()
    assert scans.calls <= 201  # one search, bounded
    for _ in range(5):
        watcher.poll()
    assert scans.calls <= 201  # no search again before RESCAN_S


def test_a_full_watch_list_stops_searching(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    for i in range(3):
        (root / f"r{i}").mkdir(parents=True)
        (root / f"r{i}" / "metrics.jsonl").write_text(train_line(1))
    monkeypatch.setattr(run_watch, "RESCAN_S", 0.0)
    watcher = run_watch.RunsWatcher(max_runs=2)
    watcher.watch([root / "r0", root / "r1"], root)
    scans = CountingScans(monkeypatch)
    for _ in range(3):
        watcher.poll()
    assert scans.calls == 0
    assert len(watcher.run_dirs()) == 2


def test_a_run_that_appears_is_found_at_the_next_search(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    root.mkdir()
    watcher = run_watch.RunsWatcher()
    watcher.watch([], root)
    assert watcher.run_dirs() == []
    (root / "new").mkdir()
    (root / "new" / "metrics.jsonl").write_text(train_line(1))
    assert watcher.run_dirs() == []  # not yet: the next search is RESCAN_S away
    monkeypatch.setattr(run_watch, "RESCAN_S", 0.0)
    assert watcher.run_dirs() == [root / "new"]


# ----- an absurd step is unknown, not a 300-digit number --------------------------------------
@pytest.mark.parametrize(
    "step",
    ["1e308", "Infinity", "-Infinity", "NaN", "1" + "0" * 400, "-5", "10000000000000000"],
)
def test_an_absurd_step_shows_as_unknown(tmp_path, refresh, step):
    run = tmp_path / "runs" / "odd"
    run.mkdir()
    line = f'{{"event": "train", "step": {step}, "tokens": {step}, "tokens_per_s": {step}}}\n'
    (run / "metrics.jsonl").write_text(train_line(1) + line)
    row = table_rows(refresh())["odd"]
    assert row[0] != "failed" or "unreadable" not in row[-1]
    assert row[1] == "–" and row[2] == "–" and row[3] == "500"  # the rate of the sane line
    p = run_progress(run)
    assert p.step is None and p.tokens_seen is None and p.tokens_per_s == 500.0


def test_a_near_zero_rate_gives_no_eta(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    progress.write_job(run, state="running", pid=os.getpid(), owner=os.getpid(), steps=10**15)
    rec = {"event": "train", "step": 1, "tokens": 10**15, "tokens_per_s": 1e-300}
    (run / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
    assert run_progress(run).eta_s is None


# ----- a line nested too deep to parse is skipped ---------------------------------------------
@pytest.mark.parametrize(
    "deep",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"a":' * 100_000 + "1" + "}" * 100_000,
        '{"event": "train", "step": 3, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "[" * 100,  # invalid and deep
    ],
    ids=["arrays", "objects", "inside-a-record", "unclosed"],
)
def test_a_deeply_nested_line_is_skipped_and_the_rest_kept(tmp_path, deep):
    path = tmp_path / "metrics.jsonl"
    path.write_text(train_line(1) + deep + "\n" + train_line(2) + train_line(4))
    tail = MetricsTail(path)
    assert [r["step"] for r in tail.read()] == [1, 2, 4]
    assert tail.bad_lines == 1
    assert [r["step"] for r in tail.records("train")] == [1, 2, 4]


def test_a_deeply_nested_line_is_a_note_on_the_runs_page(tmp_path, refresh):
    run = tmp_path / "runs" / "deep"
    run.mkdir()
    deep = "[" * 100_000 + "]" * 100_000
    (run / "metrics.jsonl").write_text(train_line(1) + deep + "\n" + train_line(2))
    response = refresh()
    assert "could not answer" not in json.dumps(response)
    row = table_rows(response)["deep"]
    assert row[1] == "2" and "1 line(s)" in row[-1]


# ----- SMELT_TRAINER that is no command line --------------------------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "trainer", ['python "unclosed', "python 'a", "python trailing\\", '""', "''"]
)
def test_an_unusable_smelt_trainer_is_one_line(tmp_path, trainer):
    env = {**os.environ, "PYTHONPATH": str(REPO), "SMELT_TRAINER": trainer, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "smelt_interp.app", "--port", str(_free_port())],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "SMELT_TRAINER" in lines[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("job.json"))


# ----- the background trainer and its whole process group ------------------------------------
WORKER = (
    "import os, sys, time; "
    "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); "
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(600)"
)


def _wrappers(tmp_path: Path) -> dict[str, list[str]]:
    script = tmp_path / "train.sh"
    script.write_text(f'#!/bin/sh\n"{sys.executable}" -c "{WORKER}" "$@"\necho worker ended\n')
    script.chmod(0o755)
    worker = f'"{sys.executable}" -c "{WORKER}" "$1"'
    return {
        "bash-c": ["bash", "-c", f"{worker}; echo worker ended", "wrapper"],
        "cd-and": ["bash", "-c", f"cd {tmp_path} && {worker} && echo done", "wrapper"],
        "script": [str(script)],
        "direct": [sys.executable, "-c", WORKER],
    }


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _kill(pid: int | None) -> None:
    if pid and _alive(pid):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize("wrapper", ["bash-c", "cd-and", "script", "direct"])
def test_stop_ends_a_wrappers_worker_too(tmp_path, wrapper):
    mark = tmp_path / "worker.pid"
    runner = JobRunner([TrainJob(tmp_path / "run", (str(mark),))], _wrappers(tmp_path)[wrapper])
    runner.start()
    worker = None
    try:
        assert wait_for(mark.exists), (tmp_path / "run" / "train.log").read_text()
        worker = int(mark.read_text())
        assert _alive(worker)
        runner.stop(grace=10.0)
        assert wait_for(lambda: not _alive(worker), timeout=10.0)
    finally:
        runner.stop(grace=1.0)
        _kill(worker)


SERVER = """
import sys, time
from pathlib import Path
from smelt_interp.app.jobs import JobRunner, TrainJob
command = sys.argv[3:]
JobRunner([TrainJob(Path(sys.argv[1]), (sys.argv[2],))], command).start()
time.sleep(600)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize("wrapper", ["bash-c", "direct"])
def test_a_killed_server_leaves_no_trainer_running(tmp_path, wrapper):
    mark = tmp_path / "worker.pid"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SERVER,
            str(tmp_path / "run"),
            str(mark),
            *_wrappers(tmp_path)[wrapper],
        ],
        env=env,
    )
    worker = None
    try:
        assert wait_for(mark.exists)
        worker = int(mark.read_text())
        assert _alive(worker)
        server.kill()  # no stop(), no handler: SIGKILL
        server.wait(10)
        assert wait_for(lambda: not _alive(worker), timeout=30.0)
    finally:
        server.kill()
        server.wait(10)
        _kill(worker)
