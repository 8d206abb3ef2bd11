"""The Runs page's server side, through the app's own callback endpoint: each refresh answers
(HTTP 200, never a traceback) for a run being written with a torn last line, a failed run, a
folder that is not a run, a folder deleted while watched and a run folder that is a file, with
a message in the row; it reads only the lines added since the last refresh and redraws the
figures only when something new was logged; the folders listed are only those given or found
under the root."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from benchmarks.runs_bench import make_client
from smelt_interp.app.pages import runs as runs_page
from smelt_interp.app.pages.run_watch import find_runs
from smelt_interp.train.progress import write_job


def train_line(step: int) -> str:
    rec = {"event": "train", "step": step, "tokens": 64 * step, "tokens_per_s": 500.0}
    return json.dumps({**rec, "loss": 3.0 / step, "lr": 1e-3}) + "\n"


@pytest.fixture
def client(tmp_path):
    """refresh(seen=None) -> the refresh callback's response, through the app's endpoint."""
    refresh, _ = make_client(tmp_path / "runs", given=[tmp_path / "given"])
    return lambda seen=None: refresh(seen)[1]


def table_rows(response) -> dict[str, list]:
    """{run name: its cells' text} of the table in a refresh's response."""
    table = response[runs_page.TABLE]["children"]
    body = table["props"]["children"][1]["props"]["children"]
    out = {}
    for tr in body:
        cells = [td["props"]["children"] for td in tr["props"]["children"]]
        state = cells[1]["props"]["children"]
        out[cells[0]] = [state, *cells[2:]]
    return out


def test_each_bad_folder_is_a_row_with_a_message(client, tmp_path):
    root = tmp_path / "runs"
    live, failed, plain = root / "pair" / "smelt", root / "failed", root / "notes"
    live.mkdir(parents=True)
    (live / "metrics.jsonl").write_text(train_line(1) + train_line(2) + '{"event": "tr')
    write_job(failed, state="failed", owner=os.getpid(), returncode=2, steps=10)
    (failed / "train.log").write_text("error: pair/smelt is in use by another training run\n")
    plain.mkdir()
    (plain / "readme.txt").write_text("not a run")
    (tmp_path / "given").write_text("a file where a run folder was given")

    rows = table_rows(client())
    given = f"{tmp_path.name}/given"  # outside the root: named by its last two folders
    assert set(rows) == {"pair/smelt", "failed", given}  # notes/ is not a run: not listed
    assert rows["pair/smelt"][0] == "failed" and rows["pair/smelt"][1] == "2"
    assert "torn" in rows["pair/smelt"][-1]
    assert rows["failed"][0] == "failed"
    assert rows["failed"][-1] == "error: pair/smelt is in use by another training run"
    assert rows[given][0] == "not a run" and "a file, not a run folder" in rows[given][-1]

    shutil.rmtree(live.parent)  # deleted while watched: still listed, as missing
    rows = table_rows(client())
    assert rows["pair/smelt"][0] == "missing" and "no such folder" in rows["pair/smelt"][-1]


def test_refresh_reads_only_new_lines_and_redraws_only_on_news(client, tmp_path):
    run = tmp_path / "runs" / "baseline"
    run.mkdir(parents=True)
    log = run / "metrics.jsonl"
    log.write_text("".join(train_line(s) for s in range(1, 11)))
    first = client()
    seen = first[runs_page.SEEN]["data"]
    assert len([k for k in first if k.startswith("{")]) == 2  # both figures drawn
    tail = runs_page.WATCHER.tail(run)
    assert tail.lines == 10 and tail.offset == log.stat().st_size

    again = client(seen)
    assert [k for k in again if k.startswith("{")] == []  # nothing new: figures kept
    with open(log, "a") as fh:
        fh.write(train_line(11))
    offset = tail.offset
    newer = client(seen)
    assert [k for k in newer if k.startswith("{")] == [ui_id("runs-curves")]  # no eval: no sink
    assert tail.lines == 11 and tail.offset == offset + len(train_line(11))
    fig = newer[ui_id("runs-curves")]["figure"]
    assert list(fig["data"][0]["x"]) == list(range(1, 12))
    assert list(fig["data"][0]["y"]) == [3.0 / s for s in range(1, 12)]
    with open(log, "a") as fh:
        fh.write(json.dumps({"event": "eval", "step": 11, "loss/dyck": 0.5, "sink_mass/0.0": 0.3}))
        fh.write("\n")
    both = client(newer[runs_page.SEEN]["data"])
    assert sorted(k for k in both if k.startswith("{")) == sorted(
        [ui_id("runs-curves"), ui_id("runs-sink")]
    )


def test_tabs_opened_on_the_same_records_share_one_drawing(client, tmp_path, monkeypatch):
    run = tmp_path / "runs" / "baseline"
    run.mkdir(parents=True)
    log = run / "metrics.jsonl"
    log.write_text("".join(train_line(s) for s in range(1, 6)))
    drawn = []
    curves_figure = runs_page.curves_figure

    def counted(views):
        drawn.append(sum(v.tail.lines for v in views))
        return curves_figure(views)

    monkeypatch.setattr(runs_page, "curves_figure", counted)
    first, second = client(), client()  # two fresh tabs: both get the figures
    key = ui_id("runs-curves")
    assert first[key] == second[key] and drawn == [5]
    with open(log, "a") as fh:
        fh.write(train_line(6))
    third = client()
    assert drawn == [5, 6] and list(third[key]["figure"]["data"][0]["x"]) == list(range(1, 7))


def ui_id(name: str) -> str:
    """The response key of graph `name` (Dash's stringified dict id)."""
    return json.dumps({"name": name, "type": "graph"}, separators=(",", ":"))


def test_only_run_folders_under_the_root_are_found(tmp_path):
    root = tmp_path / "runs"
    for where in ("a/baseline", "a/smelt", "a/smelt/branch-50", "deep/1/2/3/4", ".hidden/x"):
        (root / where).mkdir(parents=True)
        (root / where / "metrics.jsonl").write_text("")
    (root / "photos").mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "metrics.jsonl").write_text("")
    os.symlink(outside, root / "link")
    found = [p.relative_to(root).as_posix() for p in find_runs(root)]
    assert found == ["a/baseline", "a/smelt"]
