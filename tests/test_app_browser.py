"""The dashboard in a real headless Chromium (Debian's chromium + chromedriver), against the
`python -m smelt_interp.app` server on the trained tiny pair: every page loads without console
errors (and leaves a screenshot in test-artifacts/screenshots/), the attention controls redraw
the focused head, the Dyck page generates a prompt and shows both completions, a bad prompt
shows a message and the next good one works, and the server binds 127.0.0.1 unless --host."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import psutil
import pytest

if not shutil.which("chromedriver"):
    if os.environ.get("CI"):  # make test installs it; CI must not skip the browser tests
        raise RuntimeError("chromedriver is not on PATH: run `make browser`")
    pytest.skip("chromedriver is not on PATH (make browser)", allow_module_level=True)

from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

from smelt_interp.app.browser import (
    chrome,
    free_port,
    full_screenshot,
    severe_console,  # noqa: E402
    start_server,
    stop_server,
    wait_settled,
)
from smelt_interp.checkpoint import read_payload  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "screenshots"
PAGES = {
    "overview": "/",
    "attention": "/attention",
    "routing": "/routing",
    "similarity": "/similarity",
    "dyck": "/dyck",
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
            const v = z[i][j]; if (v !== null && !isNaN(v)) {{ acc += v * ((i * 31 + j) % 97 + 1); n++; }} }}
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
    """(model, right/wrong) per row of the Dyck page's table; None while it is re-rendering."""
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
def server(tiny_pair, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("app") / "server.log"
    proc = start_server(
        [tiny_pair["baseline"], tiny_pair["smelt"]], port, extra=["--threads", "1"], log=log
    )
    yield {
        "proc": proc,
        "url": f"http://127.0.0.1:{port}",
        "port": port,
        "max_seq_len": read_payload(tiny_pair["smelt"])["config"]["max_seq_len"],
    }
    stop_server(proc)


@pytest.fixture(scope="module")
def driver():
    d = chrome()
    yield d
    d.quit()


def open_page(driver, url: str) -> None:
    driver.set_window_size(1440, 1000)
    driver.get(url)
    wait_settled(driver)


@pytest.mark.parametrize("page", list(PAGES))
def test_page_loads_without_console_errors(server, driver, page):
    severe_console(driver)  # drop earlier entries
    open_page(driver, server["url"] + PAGES[page])
    n_graphs = driver.execute_script("return document.querySelectorAll('.js-plotly-plot').length")
    assert n_graphs >= 1
    assert driver.find_element(By.CSS_SELECTOR, ".nav-link.active").text
    full_screenshot(driver, SHOTS / f"{page}.png")
    assert severe_console(driver) == []


def test_attention_controls_redraw_the_focused_head(server, driver):
    open_page(driver, server["url"] + "/attention?model=smelt&layer=1&visit=1&head=0")
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
    open_page(driver, url)
    assert signature(driver, "attn-focus") == after
    assert severe_console(driver) == []


def test_download_format_reaches_every_graph(server, driver):
    open_page(driver, server["url"] + "/similarity")
    formats = "return Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => g._context.toImageButtonOptions.format)"
    assert set(driver.execute_script(formats)) == {"png"}
    click_option(driver, "img-format", "SVG")
    wait_for(lambda: set(driver.execute_script(formats)) == {"svg"}, what="svg config")
    click_option(driver, "img-format", "PNG")
    wait_for(lambda: set(driver.execute_script(formats)) == {"png"}, what="png config")


def test_dyck_generates_a_prompt_and_shows_both_completions(server, driver):
    open_page(driver, server["url"] + "/dyck")
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
    assert severe_console(driver) == []


def test_bad_prompt_shows_a_message_and_the_next_prompt_works(server, driver):
    open_page(driver, server["url"] + "/attention")

    def message() -> str | None:
        """The error message's text while it is shown, else None."""
        msg = driver.find_element(By.ID, "attn-msg")
        return msg.text if msg.is_displayed() else None

    assert message() is None
    set_text(driver, "attn-prompt", "(" * (server["max_seq_len"] + 5))
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
    assert server["proc"].poll() is None
    assert severe_console(driver) == []


def _listening(pid: int) -> set[str]:
    return {
        c.laddr.ip
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }


def test_server_binds_loopback_only(server):
    assert _listening(server["proc"].pid) == {"127.0.0.1"}


def test_host_flag_changes_the_bind_address(tiny_pair, tmp_path):
    port = free_port()
    proc = start_server(
        [tiny_pair["smelt"]],
        port,
        host="0.0.0.0",
        extra=["--threads", "1"],
        log=tmp_path / "server.log",
    )
    try:
        assert _listening(proc.pid) == {"0.0.0.0"}
    finally:
        stop_server(proc)
