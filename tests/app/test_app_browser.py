"""The dashboard in a real headless Chromium (Debian's chromium + chromedriver) on the trained
tiny pair, served in this process by dash[testing]'s `dash_duo`: every page loads without
console errors (and leaves a screenshot in test-artifacts/screenshots/), the nav bar highlights
the current page and carries the URL state, an unknown path shows the not-found page, the
attention controls redraw the focused head, the case-study page (Dyck) generates a prompt and
shows both completions and switches to associative recall, marking a held-out row, and a bad
prompt shows a message and the next good one works. The bind address is tested on the
`python -m smelt_interp.app` command as users start it (a subprocess, which dash_duo does not
run): 127.0.0.1 unless --host."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

if not shutil.which("chromedriver"):
    if os.environ.get("CI"):  # make test installs it; CI must not skip the browser tests
        raise RuntimeError("chromedriver is not on PATH: run `make browser`")
    pytest.skip("chromedriver is not on PATH (make browser)", allow_module_level=True)

from helpers.browser import free_port, full_screenshot, start_server, stop_server, wait_settled  # noqa: E402
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

from smelt_interp.app.registry import ModelRegistry  # noqa: E402
from smelt_interp.app.served import (
    Served,  # noqa: E402
    shortest_context,
)
from smelt_interp.app.server import create_app  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
PAGES = {
    "overview": "/",
    "attention": "/attention",
    "routing": "/routing",
    "similarity": "/similarity",
    "case-study": "/case-study",
}


def graph_js(name: str) -> str:
    """JS expression: the plotly div of graph `name`."""
    gid = json.dumps({"name": name, "type": "graph"}, separators=(",", ":"))
    return f"document.getElementById({json.dumps(gid)}).querySelector('.js-plotly-plot')"


def signature(driver, name: str) -> str:
    """Title, number of drawn cells and a digest of the first trace's z values of graph `name`."""
    return driver.execute_script(f"""
        const gd = {graph_js(name)};
        if (!gd || !gd._fullData || !gd._fullData.length) return '';
        const z = gd._fullData[0].z || [];   // decoded (data holds plotly's base64 arrays)
        let acc = 0, n = 0;
        for (let i = 0; i < z.length; i++) for (let j = 0; j < (z[i] || []).length; j++) {{
            const v = z[i][j];
            if (v !== null && !isNaN(v)) {{ acc += v * ((i * 31 + j) % 97 + 1); n++; }}
        }}
        const t = gd.layout.title && gd.layout.title.text;
        return (t || '') + '|' + n + '|' + acc.toFixed(6);
    """)


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    """Poll `predicate` until truthy; an element Dash replaced mid-read counts as not yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (StaleElementReferenceException, NoSuchElementException):
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def click_option(driver, radio_id: str, text: str) -> None:
    """Click a radio option by its label (again if Dash re-rendered it under the click)."""

    def click() -> bool:
        driver.find_element(
            By.XPATH, f"//div[@id='{radio_id}']//label[normalize-space(.)='{text}']"
        ).click()
        return True

    wait_for(click, what=f"a clickable {text!r} in {radio_id}")


def completions(driver) -> list[tuple[str, str]] | None:
    """(model, right/wrong) per row of the case-study page's Dyck table; None while it is
    re-rendering."""
    try:
        rows = driver.find_elements(By.CSS_SELECTOR, "table.completions tbody tr")
        return [
            (r.find_element(By.TAG_NAME, "b").text, r.find_element(By.CSS_SELECTOR, ".badge").text)
            for r in rows
        ] or None
    except StaleElementReferenceException:
        return None


def set_text(driver, element_id: str, text: str) -> None:
    box = driver.find_element(By.ID, element_id)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    box.send_keys(text)


@pytest.fixture(scope="module")
def workbench(tiny_pair) -> Served:
    """The tiny pair loaded once for the module (its caches carry over from test to test)."""
    from tqdm import tqdm

    # dash_duo stops its server by raising SystemExit in every thread started since, which
    # would include the monitor thread of the probes' progress bars: start none.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tqdm, "monitor_interval", 0)
        yield Served(ModelRegistry(tiny_pair))


@pytest.fixture
def app_url(dash_duo, workbench) -> str:
    """The dashboard's address, served from this process by dash_duo."""
    dash_duo.start_server(create_app(workbench), navigate=False, port=free_port(), start_timeout=30)
    return dash_duo.server.url


@pytest.fixture
def driver(dash_duo):
    return dash_duo.driver


def open_page(dash_duo, url: str) -> None:
    dash_duo.driver.set_window_size(1440, 1000)
    dash_duo.wait_for_page(url, timeout=60)
    wait_settled(dash_duo.driver)


@pytest.mark.parametrize("page", list(PAGES))
def test_page_loads_without_console_errors(dash_duo, app_url, driver, page):
    open_page(dash_duo, app_url + PAGES[page])
    n_graphs = driver.execute_script("return document.querySelectorAll('.js-plotly-plot').length")
    assert n_graphs >= 1
    assert driver.find_element(By.CSS_SELECTOR, ".nav-link.active").text
    full_screenshot(driver, SHOTS / f"{page}.png")
    assert dash_duo.get_logs() == []


def test_styles_come_from_the_assets_folder(dash_duo, app_url, driver):
    open_page(dash_duo, app_url + "/")
    top = driver.find_element(By.CSS_SELECTOR, "header.topbar")
    assert top.value_of_css_property("background-color") == "rgba(31, 36, 48, 1)"
    assert top.value_of_css_property("position") == "sticky"


def test_nav_highlights_the_page_and_carries_the_url_state(dash_duo, app_url, driver):
    open_page(dash_duo, app_url + "/attention?model=baseline&layer=2")
    active = driver.find_element(By.CSS_SELECTOR, ".nav-link.active")
    assert active.text == "Attention"
    # the page writes its whole state into the URL; every nav link carries it
    wait_for(lambda: "head=" in driver.current_url, what="the page's state in the URL")
    routing = driver.find_element(By.LINK_TEXT, "Routing")
    assert routing.get_attribute("href") == driver.current_url.replace("/attention?", "/routing?")
    assert "model=baseline&layer=2&" in routing.get_attribute("href")
    routing.click()
    wait_for(
        lambda: driver.find_element(By.CSS_SELECTOR, ".nav-link.active").text == "Routing",
        what="the Routing link highlighted",
    )
    wait_settled(driver)
    checked = driver.find_element(By.CSS_SELECTOR, "#routing-model input:checked")
    assert checked.get_attribute("value") == "baseline"  # the model chosen on the other page
    # a control changes this page's keys in the URL and keeps the Attention page's layer
    click_option(driver, "routing-model", "smelt")
    wait_for(lambda: "model=smelt" in driver.current_url, what="model=smelt in the URL")
    assert "layer=2" in driver.current_url
    assert dash_duo.get_logs() == []


def test_unknown_path_shows_not_found(dash_duo, app_url, driver):
    dash_duo.wait_for_page(app_url + "/nope", timeout=60)
    dash_duo.wait_for_text_to_equal("h1", "Page not found")
    assert "There is no page at /nope." in driver.find_element(By.CSS_SELECTOR, ".page-head").text
    assert not driver.find_elements(By.CSS_SELECTOR, ".nav-link.active")
    links = driver.find_elements(By.CSS_SELECTOR, ".card li a")
    assert [a.text for a in links][:2] == ["Overview", "Attention"]


def test_attention_controls_redraw_the_focused_head(dash_duo, app_url, driver):
    open_page(dash_duo, app_url + "/attention?model=smelt&layer=1&visit=1&head=0")
    seen = {signature(driver, "attn-focus")}
    for radio, option, key in (
        ("attn-layer", "2 ↻", "layer=2"),
        ("attn-visit", "0", "visit=0"),
        ("attn-head", "1", "head=1"),
    ):
        before = signature(driver, "attn-focus")
        click_option(driver, radio, option)
        after = wait_for(
            lambda: (s := signature(driver, "attn-focus")) != before and s, what=f"{radio} redraw"
        )
        assert after.split("|", 1)[1] not in {
            sig.split("|", 1)[1] for sig in seen
        }  # new values, not just a title
        seen.add(after)
        wait_for(lambda: key in driver.current_url, what=f"{key} in the URL")
    assert "smelt · layer 2 · visit 0 · head 1" in after
    # the URL restores the view
    url = driver.current_url
    open_page(dash_duo, url)
    assert signature(driver, "attn-focus") == after
    assert dash_duo.get_logs() == []


def test_download_format_reaches_every_graph(dash_duo, app_url, driver):
    open_page(dash_duo, app_url + "/similarity")
    formats = (
        "return Array.from(document.querySelectorAll('.js-plotly-plot'))"
        ".map(g => g._context.toImageButtonOptions.format)"
    )
    assert set(driver.execute_script(formats)) == {"png"}
    click_option(driver, "img-format", "SVG")
    wait_for(lambda: set(driver.execute_script(formats)) == {"svg"}, what="svg config")
    click_option(driver, "img-format", "PNG")
    wait_for(lambda: set(driver.execute_script(formats)) == {"png"}, what="png config")


def test_dyck_generates_a_prompt_and_shows_both_completions(dash_duo, app_url, driver):
    open_page(dash_duo, app_url + "/case-study?task=dyck")
    old = driver.find_element(By.ID, "dyck-prompt").get_attribute("value")
    set_text(driver, "dyck-seed", "11")
    driver.find_element(By.ID, "dyck-seed").send_keys(Keys.TAB)
    driver.find_element(By.ID, "dyck-generate").click()
    wait_for(
        lambda: driver.find_element(By.ID, "dyck-prompt").get_attribute("value") != old,
        what="a new prompt",
    )
    new = driver.find_element(By.ID, "dyck-prompt").get_attribute("value")
    query = new.strip().splitlines()[-1]
    wait_for(
        lambda: query in driver.find_element(By.CSS_SELECTOR, "pre.dyck").text,
        what="the new example",
    )
    wait_settled(driver)
    rows = wait_for(lambda: completions(driver), what="the completions table")
    assert [name for name, _ in rows] == ["baseline", "smelt"]
    assert all(verdict in ("right", "wrong") for _, verdict in rows)
    assert "seed=11" in driver.current_url
    assert dash_duo.get_logs() == []


def test_case_study_switches_to_recall_and_marks_a_row(dash_duo, app_url, driver):
    open_page(dash_duo, app_url + "/case-study?task=dyck")
    assert driver.find_element(By.ID, "case-dyck").is_displayed()
    click_option(driver, "case-task", "Associative recall")
    wait_for(
        lambda: (
            driver.find_element(By.ID, "case-recall").is_displayed()
            and not driver.find_element(By.ID, "case-dyck").is_displayed()
        ),
        what="the recall section in place of the Dyck one",
    )
    wait_for(lambda: "task=assoc_recall" in driver.current_url, what="the task in the URL")
    chosen = wait_for(
        lambda: driver.find_elements(By.CSS_SELECTOR, "#recall-tokens .tok-query"),
        what="the chosen answer position marked",
    )
    assert len(chosen) == 1 and driver.find_elements(By.CSS_SELECTOR, "#recall-tokens .tok-demo")
    # the paper's quantity leads: the row's head means per model, and the aggregate's table
    # (the probe runs on both tasks' held-out inputs first: minutes on a shared CPU)
    wait_for(
        lambda: driver.find_elements(By.CSS_SELECTOR, "#recall-quantity table.case-quantity tr"),
        timeout=180,
        what="the row's head-mean table",
    )
    wait_for(
        lambda: driver.find_elements(By.CSS_SELECTOR, "#case-aggregate-table table.case-aggregate"),
        timeout=300,
        what="the aggregate's head-mean table",
    )
    wait_settled(driver)
    assert dash_duo.get_logs() == []


def test_bad_prompt_shows_a_message_and_the_next_prompt_works(dash_duo, app_url, driver, workbench):
    open_page(dash_duo, app_url + "/attention")

    def message() -> str | None:
        """The error message's text while it is shown, else None."""
        msg = driver.find_element(By.ID, "attn-msg")
        return msg.text if msg.is_displayed() else None

    assert message() is None
    set_text(driver, "attn-prompt", "(" * (shortest_context(workbench) + 5))
    driver.find_element(By.ID, "attn-run").click()
    wait_for(lambda: "at most" in (message() or ""), what="the error message")
    full_screenshot(driver, SHOTS / "attention-bad-prompt.png")
    set_text(driver, "attn-prompt", "Input: ( [ Output: ] )")
    driver.find_element(By.ID, "attn-run").click()
    wait_for(lambda: message() is None, what="the message to clear")
    wait_for(
        lambda: driver.find_element(By.ID, "attn-info").text.startswith("23 tokens"),
        what="the new prompt",
    )
    # the focused head is redrawn for the 23-token prompt: a causal 23 x 23 map has 276 entries
    wait_for(lambda: "|276|" in signature(driver, "attn-focus"), what="a 23-token attention map")
    with urllib.request.urlopen(app_url, timeout=10) as resp:  # the server still answers
        assert resp.status == 200
    assert dash_duo.get_logs() == []


def _listening(pid: int) -> set[str]:
    return {
        c.laddr.ip
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }


@pytest.mark.parametrize("host", [None, "0.0.0.0"])
def test_cli_binds_loopback_unless_host_says_otherwise(tiny_pair, tmp_path, host):
    port = free_port()
    proc = start_server(
        [tiny_pair["baseline"], tiny_pair["smelt"]],
        port,
        host=host,
        extra=["--threads", "1"],
        log=tmp_path / "server.log",
    )
    try:
        assert _listening(proc.pid) == {host or "127.0.0.1"}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/assets/smelt.css", timeout=10) as r:
            assert b".topbar" in r.read()
    finally:
        stop_server(proc)
