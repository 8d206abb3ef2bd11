"""Driving the dashboard from a real headless Chromium, for the browser tests
(tests/app/test_app_browser.py), the benchmark (benchmarks/app_bench.py) and the README picture
(docs/make_dashboard_png.py). Needs selenium and a chromedriver on PATH (Debian: chromium,
chromium-driver).

The browser tests get their Chrome and an in-process server from dash[testing]'s `dash_duo`
(tests/conftest.py hands it `chrome_options()`). What dash_duo does not do is here: the
dashboard started as a real subprocess through its command line (`start_server`: the bind
address tests, the benchmark and the picture need the CLI as users run it; `wait_until_serving`
for any dashboard process, the one wait loop), a Chrome outside
pytest (`chrome`), waiting until every graph has drawn (`wait_settled`) and whole-page
screenshots written atomically (`full_screenshot`)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from smelt_interp.files import atomic_write

REPO = Path(__file__).resolve().parents[2]

CHROME_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
)

# True once Dash has no request in flight and every graph on the page has drawn.
SETTLED_JS = """
const page = document.getElementById('_pages_content');
if (!window.store || !page || !page.children.length) return false;
if (window.store.getState().isLoading) return false;
const boxes = document.querySelectorAll('div.graph');
const plots = Array.from(document.querySelectorAll('div.graph .js-plotly-plot'));
return plots.length === boxes.length && plots.every(g => g._fullLayout !== undefined);
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    ckpts: Sequence[str | Path],
    port: int,
    *,
    host: str | None = None,
    extra: Sequence[str] = (),
    timeout: float = 120.0,
    log: Path | None = None,
) -> subprocess.Popen:
    """Run the dashboard CLI and wait until it answers HTTP; raises RuntimeError (with its
    output) if it exits or does not answer in time."""
    cmd = [sys.executable, "-m", "smelt_interp.app", *map(str, ckpts), "--port", str(port), *extra]
    if host:
        cmd += ["--host", host]
    out = open(log, "wb") if log else subprocess.DEVNULL
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    probe = "127.0.0.1" if host in (None, "0.0.0.0", "127.0.0.1") else host
    wait_until_serving(proc, f"http://{probe}:{port}/", timeout, log)
    return proc


def wait_until_serving(
    proc: subprocess.Popen, url: str, timeout: float, log: Path | None = None
) -> None:
    """Poll `url` until the dashboard process `proc` answers it with HTTP 200. Raises
    RuntimeError, with the end of its `log`, if it exits first, or stops it and raises if it
    does not answer within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = Path(log).read_text(errors="replace") if log else ""
            raise RuntimeError(f"dashboard exited with {proc.returncode}: {text[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    stop_server(proc)
    raise RuntimeError(f"dashboard did not answer {url} within {timeout:.0f} s")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def chrome_options(width: int = 1440, height: int = 1000):
    """Options for a headless Chromium with the flags a sandboxed CI needs."""
    from selenium import webdriver

    opts = webdriver.ChromeOptions()
    for flag in CHROME_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--window-size={width},{height}")
    for binary in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if os.path.exists(binary):
            opts.binary_location = binary
            break
    return opts


def chrome(width: int = 1440, height: int = 1000):
    """A headless Chromium (selenium webdriver) with its console log readable."""
    from selenium import webdriver

    opts = chrome_options(width, height)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts)
    driver.set_page_load_timeout(60)
    return driver


def wait_settled(driver, timeout: float = 60.0, quiet: float = 0.3) -> None:
    """Wait until Dash is idle and all graphs have drawn, and stay so for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    since = None
    while time.monotonic() < deadline:
        if driver.execute_script(SETTLED_JS):
            since = since or time.monotonic()
            if time.monotonic() - since >= quiet:
                return
        else:
            since = None
        time.sleep(0.05)
    raise TimeoutError("the page did not settle")


def full_screenshot(driver, path: Path, width: int = 1440) -> None:
    """A screenshot of the whole page height, written atomically (an old picture survives a
    failure)."""
    height = driver.execute_script(
        "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)"
    )
    driver.set_window_size(width, min(int(height) + 160, 8000))
    time.sleep(0.3)
    png = driver.get_screenshot_as_png()
    atomic_write(path, lambda fh: fh.write(png))


def require_chromedriver() -> None:
    """At a browser test module's top: skip the module when chromedriver is missing, except on
    CI (`make test` installs it there, and CI must not skip the browser tests)."""
    import pytest

    if shutil.which("chromedriver"):
        return
    if os.environ.get("CI"):
        raise RuntimeError("chromedriver is not on PATH: run `make browser`")
    pytest.skip("chromedriver is not on PATH (make browser)", allow_module_level=True)


def wait_for(predicate, timeout: float = 30.0, what: str = "condition", every: float = 0.1):
    """Poll `predicate` until it returns something truthy, and return that; AssertionError
    naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def text_of(driver, css: str) -> str | None:
    """The visible text of the first element matching `css`, read in one script call (None if
    there is none): a page that re-renders on an interval can replace an element between a
    WebDriver lookup and a later `.text`, which raises StaleElementReferenceException."""
    return driver.execute_script(
        "const el = document.querySelector(arguments[0]); return el ? el.innerText : null;", css
    )


# What a figure carrying no data says when a view failed (figures.theme.message_figure texts
# that are errors, as opposed to a view that does not apply to a model and says so)
ERROR_WORDS = ("error", "cannot", "too long", "at most", "exceeds", "failed")
DRAWN_JS = """
return Array.from(document.querySelectorAll('div.graph .js-plotly-plot')).map(g => ({
    traces: (g._fullData || []).filter(t => t.visible !== false).length,
    notes: ((g.layout && g.layout.annotations) || []).map(a => a.text || ''),
}));
"""


def open_working_view(dash_duo, url: str, where: str) -> tuple[list[dict], list[str]]:
    """Open a dashboard page, wait until it settles, and assert it shows no message box, no
    figure whose note reads as an error, and nothing in the console. Returns its figures
    ({traces, notes} each) and the notes of the figures that drew no data."""
    from selenium.webdriver.common.by import By

    dash_duo.wait_for_page(url, timeout=60)
    driver = dash_duo.driver
    wait_settled(driver, timeout=180)
    shown = [
        m.text
        for m in driver.find_elements(By.CSS_SELECTOR, ".message")
        if m.is_displayed() and m.text.strip()
    ]
    assert not shown, f"{where}: {shown}"
    graphs = driver.execute_script(DRAWN_JS)
    notes = [n for g in graphs if not g["traces"] for n in g["notes"]]
    errors = [n for n in notes if any(w in n.lower() for w in ERROR_WORDS)]
    assert not errors, f"{where}: {errors}"
    assert dash_duo.get_logs() == [], where
    return graphs, notes
