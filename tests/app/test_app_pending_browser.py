"""A pair's pages while its run trains, in a real headless Chromium: the app is started on the
folder of a tiny run that `python -m smelt_interp.train` is training in a subprocess; before
the run's first checkpoint the Attention page shows the run's step of steps and its ETA, and
when the trainer writes the checkpoint the page fills in by itself (no reload by the test, no
server restart) with the attention heatmap. The trainer is paused (SIGSTOP) while the "before"
page is checked, so the checkpoint cannot race it, and resumed to write the checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

if not shutil.which("chromedriver"):
    if os.environ.get("CI"):  # make test installs it; CI must not skip the browser tests
        raise RuntimeError("chromedriver is not on PATH: run `make browser`")
    pytest.skip("chromedriver is not on PATH (make browser)", allow_module_level=True)

from helpers.browser import REPO, free_port, full_screenshot, text_of, wait_for  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

from smelt_interp.app.registry import ModelRegistry, find_checkpoints  # noqa: E402
from smelt_interp.app.served import Served  # noqa: E402
from smelt_interp.app.server import create_app  # noqa: E402
from smelt_interp.train.progress import write_job  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STEPS, CKPT_EVERY = 40, 20


def train_records(run: Path) -> list[dict]:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [
        r for line in lines if line.endswith("}") and (r := json.loads(line))["event"] == "train"
    ]


@pytest.fixture
def trainer(tmp_path):
    """A tiny SMELT training into tmp_path/pair/smelt (a checkpoint every CKPT_EVERY steps),
    recorded as a running job of STEPS steps, as the dashboard's launcher records it."""
    out = tmp_path / "pair"
    cmd = [sys.executable, "-m", "smelt_interp.train", "--preset", "dyck-pair-tiny"]
    cmd += ["--arch", "smelt", "--out", str(out), "--quiet"]
    cmd += ["--set", f"steps={STEPS}", "--set", f"ckpt_every={CKPT_EVERY}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "train.out", "wb")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    write_job(out / "smelt", state="running", pid=proc.pid, steps=STEPS)
    yield proc, out / "smelt"
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait(10)
    log.close()


def test_attention_page_shows_progress_then_fills_in_when_the_checkpoint_appears(
    dash_duo, trainer, tmp_path
):
    from tqdm import tqdm

    proc, run = trainer
    wait_for(lambda: train_records(run) or proc.poll() is not None, 60, "the first train step")
    os.kill(proc.pid, signal.SIGSTOP)  # hold the run before its first checkpoint
    assert proc.poll() is None, (tmp_path / "train.out").read_text()[-2000:]
    assert not (run / "ckpt.pt").exists()
    step = train_records(run)[-1]["step"]
    assert step < CKPT_EVERY

    registry = ModelRegistry(find_checkpoints([run.parent]))
    assert registry.names == [] and [name for name, _ in registry.pending()] == ["smelt"]
    with pytest.MonkeyPatch.context() as mp:
        # dash_duo stops its server by raising SystemExit in every thread started since,
        # which would include the monitor thread of the probes' progress bars: start none
        mp.setattr(tqdm, "monitor_interval", 0)
        dash_duo.start_server(
            create_app(Served(registry)), navigate=False, port=free_port(), start_timeout=30
        )
        driver = dash_duo.driver
        dash_duo.wait_for_page(dash_duo.server.url + "/attention", timeout=60)
        text = wait_for(lambda: text_of(driver, ".pending-progress"), 30, "progress")
        assert text.startswith(f"step {step} of {STEPS} ({step / STEPS:.0%})"), text
        assert "ETA " in text and "tokens/s" in text
        assert "Waiting for the first checkpoint" in text_of(driver, "#page")
        assert not driver.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")
        full_screenshot(driver, REPO / "test-artifacts" / "screenshots" / "attention-training.png")

        os.kill(proc.pid, signal.SIGCONT)  # the trainer goes on and writes its checkpoint
        wait_for(lambda: (run / "ckpt.pt").exists(), 60, "the trainer's checkpoint")
        heatmap = (
            'const g = document.getElementById(\'{"name":"attn-focus","type":"graph"}\');'
            "const p = g && g.querySelector('.js-plotly-plot');"
            "return !!(p && p._fullData && p._fullData.length && p._fullData[0].type == 'heatmap');"
        )
        wait_for(lambda: driver.execute_script(heatmap), 45, "the attention heatmap")
        assert not driver.find_elements(By.CSS_SELECTOR, ".pending-progress")
        assert dash_duo.get_logs() == []
