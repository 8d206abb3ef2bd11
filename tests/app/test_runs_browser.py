"""The Runs page in a real headless Chromium (Debian's chromium + chromedriver), served in this
process by dash[testing]'s `dash_duo`, while a tiny run trains in a subprocess started as the
dashboard starts its jobs (app.jobs.JobRunner, `python -m smelt_interp.train ... --resume`):
the run's row shows it training and its step advances at least twice, its loss curve draws;
beside it a failed run shows its log's last line, a folder deleted while watched is shown as
missing, and the page keeps refreshing after both."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from helpers.browser import free_port, full_screenshot, require_chromedriver

require_chromedriver()

from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

from smelt_interp.app.jobs import JobRunner, TrainJob  # noqa: E402
from smelt_interp.app.pages import runs as runs_page  # noqa: E402
from smelt_interp.app.registry import ModelRegistry  # noqa: E402
from smelt_interp.app.served import Served  # noqa: E402
from smelt_interp.app.server import create_app  # noqa: E402
from smelt_interp.train.progress import write_job  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
STEPS = 100_000  # far more than the test watches: the run is still training when it ends


def rows(driver) -> dict[str, tuple[str, str, str]] | None:
    """{run name: (state, step cell, note)} of the Runs table; None while it re-renders."""
    try:
        out = {}
        for tr in driver.find_elements(By.CSS_SELECTOR, "table.runs-table tbody tr"):
            cells = tr.find_elements(By.TAG_NAME, "td")
            out[cells[0].text] = (cells[1].text, cells[2].text, cells[6].text)
        return out or None
    except (StaleElementReferenceException, NoSuchElementException, IndexError):
        return None


def step_of(cell: str) -> int | None:
    head = cell.split(" of ")[0].replace(",", "")
    return int(head) if head.isdigit() else None


def curve_points(driver) -> int:
    """How many training-loss points the curves graph holds (0 before it draws)."""
    gid = json.dumps({"name": "runs-curves", "type": "graph"}, separators=(",", ":"))
    return driver.execute_script(f"""
        const el = document.getElementById({json.dumps(gid)});
        const gd = el && el.querySelector('.js-plotly-plot');
        if (!gd || !gd.data || !gd.data.length || !gd.data[0].x) return 0;
        return gd.data[0].x.length;
    """)


def test_runs_page_follows_a_training_run(dash_duo, tmp_path, make_cfg, make_model):
    root = tmp_path / "runs"
    tiny = root / "tiny" / "baseline"
    failed, doomed = root / "broken", root / "doomed"
    write_job(failed, state="failed", owner=os.getpid(), returncode=2, steps=50)
    (failed / "train.log").write_text("starting\nerror: loss became nan at step 7 (lr 3)\n")
    doomed.mkdir(parents=True)
    (doomed / "metrics.jsonl").write_text('{"event": "train", "step": 3, "loss": 1.0}\n')
    job = TrainJob(
        tiny,
        ("--preset", "dyck-pair-tiny", "--arch", "baseline", "--out", str(tiny.parent))
        + ("--resume", "--quiet", "--set", f"steps={STEPS}", "--set", "threads=1"),
        STEPS,
    )
    runner = JobRunner([job], command=[sys.executable, "-m", "smelt_interp.train"]).start()
    try:
        runs_page.watch([], root=root)
        models = {"baseline": make_model(make_cfg(looped=False)), "smelt": make_model(make_cfg())}
        app = create_app(Served(ModelRegistry.from_models(models)))
        dash_duo.start_server(app, navigate=False, port=free_port(), start_timeout=30)
        driver = dash_duo.driver
        driver.set_window_size(1440, 1000)
        dash_duo.wait_for_page(dash_duo.server.url + "/runs", timeout=60)

        deadline = time.monotonic() + 90
        steps: list[int] = []
        table = None
        while time.monotonic() < deadline and len(steps) < 3:
            table = rows(driver) or {}
            state, cell, _ = table.get("tiny/baseline", ("", "", ""))
            step = step_of(cell)
            if state == "training" and step is not None and (not steps or step > steps[-1]):
                steps.append(step)
                assert cell.endswith(f" of {STEPS:,}")
            time.sleep(0.2)
        assert len(steps) >= 3, (steps, table)  # the step advanced at least twice
        assert table["broken"][0] == "failed"
        assert table["broken"][2] == "error: loss became nan at step 7 (lr 3)"
        assert table["doomed"][0] == "failed"  # stopped: no trainer holds it

        shutil.rmtree(doomed)  # deleted while watched: shown as missing, the page goes on
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            table = rows(driver) or {}
            if table.get("doomed", ("",))[0] == "missing":
                break
            time.sleep(0.2)
        assert table["doomed"][0] == "missing" and "no such folder" in table["doomed"][2]
        assert curve_points(driver) >= 1
        full_screenshot(driver, SHOTS / "runs.png")
        later = step_of(table["tiny/baseline"][1])
        assert later is not None and later >= steps[-1]
        severe = [e for e in dash_duo.get_logs() or [] if e.get("level") == "SEVERE"]
        assert severe == []
    finally:
        runner.stop()
    assert runner.current is None or runner.current.poll() is not None
