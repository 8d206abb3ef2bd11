"""Following a run while it trains (smelt_interp.train.progress): MetricsTail read in pieces,
with a torn last line, gives the table the whole-file reader (train.metrics.read_metrics)
gives for the finished file; its history is a fixed-size, evenly strided sample of each
series; a replaced or shrunk log starts it over. run_progress names each state of a folder,
and answers a folder that is missing, a file, not a run, failed or stopped without raising."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pytest

from smelt_interp.checkpoint import save_checkpoint
from smelt_interp.train.metrics import read_metrics, truncate_metrics
from smelt_interp.train.progress import (
    MetricsTail,
    Series,
    lock_held,
    run_progress,
    write_job,
)
from smelt_interp.train.run_folder import RunFolder


def trainer_lines(n_steps: int, eval_every: int = 10, tokens_per_step: int = 256) -> list[str]:
    """Log lines shaped as the trainer writes them (json.dumps + newline), with a non-ASCII
    field so a piece can end inside a multi-byte character."""
    lines = []
    for step in range(1, n_steps + 1):
        rec = {
            "event": "train",
            "step": step,
            "tokens": step * tokens_per_step,
            "tokens_per_s": 1000.0 + step,
            "loss": 5.0 / step,
            "lr": 1e-3,
            "note": "é→",
        }
        lines.append(json.dumps(rec) + "\n")
        if step % eval_every == 0:
            ev = {"event": "eval", "step": step, "loss/dyck": 1.0 / step, "sink_mass/1.0": 0.5}
            lines.append(json.dumps(ev) + "\n")
    return lines


def append_in_pieces(path: Path, data: bytes, tail: MetricsTail, seed: int) -> list[dict]:
    """Append `data` in random pieces (cutting lines and characters), reading after each."""
    rng = random.Random(seed)
    seen, at = [], 0
    while at < len(data):
        size = rng.randint(1, 300)
        with open(path, "ab") as fh:
            fh.write(data[at : at + size])
        at += size
        seen += tail.read()
    return seen


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pieces_with_a_torn_line_give_the_whole_file_table(tmp_path, seed):
    path = tmp_path / "metrics.jsonl"
    data = "".join(trainer_lines(120)).encode()
    torn = b'{"event": "train", "step": 121, "tok'  # the trainer killed mid-append
    tail = MetricsTail(path, cap=10_000)
    seen = append_in_pieces(path, data + torn, tail, seed)
    reference = read_metrics(path)  # drops the torn last line
    assert len(reference) == 132
    assert seen == reference
    assert tail.records("train") == [r for r in reference if r["event"] == "train"]
    assert tail.records("eval") == [r for r in reference if r["event"] == "eval"]
    assert tail.torn and tail.bad_lines == 0
    assert tail.read() == []  # nothing new: nothing re-read


def test_a_torn_line_appears_once_completed(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"event": "train", "step": 1}\n{"event": "train", "st')
    tail = MetricsTail(path)
    assert [r["step"] for r in tail.read()] == [1]
    assert tail.torn
    with open(path, "a") as fh:
        fh.write('ep": 2}\n')
    assert tail.read() == [{"event": "train", "step": 2}]
    assert not tail.torn


@pytest.mark.parametrize("n, cap", [(100, 8), (1000, 7), (5, 8), (64, 16)])
def test_history_is_an_even_sample_of_bounded_size(n, cap):
    series = Series(cap)
    records = [{"step": i} for i in range(n)]
    for r in records:
        series.add(r)
    # the smallest power of two whose sample fits the cap, computed without the class
    stride = next(2**k for k in range(64) if math.ceil(n / 2**k) <= cap)
    expected = records[::stride]
    if expected[-1] is not records[-1]:
        expected.append(records[-1])
    assert series.records() == expected
    assert len(series.kept) <= cap


def test_a_hundred_thousand_lines_cost_at_most_the_cap(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(trainer_lines(100_000, eval_every=100)))
    tail = MetricsTail(path, cap=500)
    assert len(tail.read()) == 101_000
    assert len(tail.series["train"].kept) <= 500 and len(tail.series["eval"].kept) <= 500
    assert tail.last("train")["step"] == 100_000
    assert tail.records("train")[0]["step"] == 1


def test_a_replaced_or_shrunk_log_starts_over(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(trainer_lines(50)))
    tail = MetricsTail(path)
    tail.read()
    generation = tail.generation
    truncate_metrics(path, 20)  # what a resumed run does: an atomic rewrite, a new inode
    with open(path, "a") as fh:
        fh.write("".join(trainer_lines(30)[20 + 2 :]))  # steps 21.. again (past two evals)
    tail.read()
    assert tail.generation == generation + 1
    assert tail.records("train") == [r for r in read_metrics(path) if r["event"] == "train"]
    with open(path, "r+") as fh:  # shrunk in place
        fh.truncate(0)
    assert tail.read() == [] and tail.generation == generation + 2
    os.unlink(path)
    assert tail.read() == [] and tail.missing
    path.write_text('{"event": "train", "step": 7}\n')
    assert tail.read() == [{"event": "train", "step": 7}] and not tail.missing


def test_a_line_that_is_not_json_is_counted_and_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    good = ['{"event": "train", "step": 1}', '{"event": "train", "step": 2}']
    path.write_text(f"{good[0]}\nnot json\n[1, 2]\n{good[1]}\n")
    tail = MetricsTail(path)
    assert [r["step"] for r in tail.read()] == [1, 2]
    assert tail.bad_lines == 2


# ----- run_progress ---------------------------------------------------------------------------
def write_log(run: Path, steps: int) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(trainer_lines(steps)))


def test_missing_file_and_foreign_folders(tmp_path):
    gone = run_progress(tmp_path / "gone")
    assert gone.state == "missing" and "no such folder" in gone.message
    (tmp_path / "file").write_text("x")
    assert run_progress(tmp_path / "file").state == "not_a_run"
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_text("x")
    foreign = run_progress(tmp_path / "photos")
    assert foreign.state == "not_a_run" and "not a run folder" in foreign.message


def test_training_while_the_lock_is_held_with_speed_and_eta(tmp_path):
    run = tmp_path / "baseline"
    write_log(run, 40)
    write_job(run, state="running", owner=os.getpid(), pid=None, steps=100)
    with RunFolder(run):
        assert lock_held(run)
        p = run_progress(run)
    assert p.state == "training"
    assert (p.step, p.steps, p.tokens_seen) == (40, 100, 40 * 256)
    speeds = [1000.0 + s for s in range(21, 41)]  # the last 20 train records
    speed = sorted(speeds)[9] / 2 + sorted(speeds)[10] / 2
    assert p.tokens_per_s == pytest.approx(speed)
    assert p.eta_s == pytest.approx(60 * 256 / speed)
    assert not lock_held(run)


def test_queued_failed_stopped_and_finished(tmp_path, tiny_model):
    queued = tmp_path / "queued"
    write_job(queued, state="queued", owner=os.getpid(), steps=100)
    p = run_progress(queued)
    assert (p.state, p.step, p.steps) == ("queued", None, 100)

    failed = tmp_path / "failed"
    write_log(failed, 12)
    (failed / "train.log").write_text("loading\nerror: loss became nan at step 12 (lr 0.1)\n")
    write_job(failed, state="failed", owner=os.getpid(), returncode=2, steps=100)
    p = run_progress(failed)
    assert p.state == "failed" and p.message == "error: loss became nan at step 12 (lr 0.1)"
    assert p.step == 12

    stopped = tmp_path / "stopped"  # killed, its owner gone: it says how to continue
    write_log(stopped, 30)
    write_job(stopped, state="queued", owner=2**22 + 12345, steps=100)
    p = run_progress(stopped)
    assert p.state == "failed" and "stopped at step 30 of 100" in p.message
    assert "--resume" in p.message
    never_started = tmp_path / "never_started"  # queued, then its server stopped
    write_job(never_started, state="stopped", owner=2**22 + 12345, steps=100)
    p = run_progress(never_started)
    assert p.state == "queued" and p.step is None and "not started" in p.message

    done = tmp_path / "done"
    write_log(done, 20)
    save_checkpoint(done / "ckpt.pt", tiny_model, step=20, final=True, train_config={"steps": 20})
    p = run_progress(done)
    assert (p.state, p.step, p.steps, p.eta_s) == ("finished", 20, 20, None)


@pytest.mark.parametrize("name", ["metrics.jsonl", "train.log", "job.json"])
def test_a_fifo_where_a_run_file_belongs_is_answered_without_blocking(tmp_path, name):
    """A FIFO opens only once a writer comes, so a reader that opened it as a plain file would
    hang the dashboard's callback thread for good; it reads as no file instead."""
    import threading

    from smelt_interp.train.progress import read_job

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"event": "train", "step": 1}) + "\n")
    (run / name).unlink(missing_ok=True)
    os.mkfifo(run / name)
    answers: list = []

    def read_all() -> None:
        answers.append(run_progress(run))
        answers.append(MetricsTail(run / "metrics.jsonl").read())
        answers.append(read_job(run))

    reader = threading.Thread(target=read_all, daemon=True)  # daemon: a hang fails, not blocks
    reader.start()
    reader.join(20)
    assert not reader.is_alive(), f"reading a run with a FIFO as {name} blocked"
    progress, records, job = answers
    assert isinstance(progress.state, str)
    if name == "metrics.jsonl":
        assert records == []
    else:
        assert [r["step"] for r in records] == [1]
    assert job == {}
