"""Every page opens on a working view, in a real headless Chromium (Debian's chromium +
chromedriver) served by dash[testing]'s `dash_duo`: with the demo's four models (a 64-token
recall pair first, then a 512-token Dyck pair; helpers.demo_models) and with each of them alone,
each page's default URL draws at least one figure with data, shows no error message (prompt
boxes, figures that say why they are empty) and logs nothing to the browser console; and the
same with the real pretrained model (SmolLM2-135M, `make real-lm`) alone and beside them. The
four-model views are left as screenshots in test-artifacts/screenshots/default-*.png."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from helpers.browser import (
    free_port,
    full_screenshot,
    open_working_view,
    require_chromedriver,
)
from helpers.demo_models import NAMES, demo_checkpoints
from selenium.webdriver.common.by import By

require_chromedriver()


from smelt_interp.adapters.real_lm import FOLDER, manifest_problem  # noqa: E402
from smelt_interp.app.pages import PAGES  # noqa: E402
from smelt_interp.app.pages import runs as runs_page  # noqa: E402
from smelt_interp.app.registry import ModelRegistry  # noqa: E402
from smelt_interp.app.served import Served  # noqa: E402
from smelt_interp.app.server import create_app  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
# The real pretrained model `make demo` serves beside the pairs (`make real-lm` prepares it)
REAL = "smollm2-135m"
REAL_FOLDER = Path(__file__).resolve().parents[2] / FOLDER
SERVED = {
    "the demo's four": NAMES,
    **{f"{name} alone": (name,) for name in NAMES},
    f"{REAL} alone": (REAL,),
    f"the demo's four and {REAL}": (*NAMES, REAL),
}


# what a page says instead of drawing when the real model is served alone: it routes nothing
# (a dense MLP) and is no run of this project's trainer
ALONE_SAYS = {"/routing": "no routed experts", "/runs": "not a run of this project's trainer"}
# The case study's 16 prompts per demonstration count take SmolLM2 about three minutes of
# greedy decoding on two cores: 4 draw the same views in a quarter of it
REAL_PROMPTS = 4


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    return {**demo_checkpoints(tmp_path_factory.mktemp("demo")), REAL: REAL_FOLDER}


@pytest.mark.parametrize("served", list(SERVED))
def test_every_page_opens_on_a_working_view(dash_duo, checkpoints, served, monkeypatch):
    from tqdm import tqdm

    monkeypatch.setattr(tqdm, "monitor_interval", 0)  # dash_duo stops every thread it finds
    names = SERVED[served]
    if REAL in names and manifest_problem(REAL_FOLDER) is not None:
        pytest.skip(
            f"the real model is not prepared ({manifest_problem(REAL_FOLDER)}): make real-lm"
        )
    runs_page.watch([checkpoints[n].parent for n in names if n != REAL], root=None)
    wb = Served(ModelRegistry({n: checkpoints[n] for n in names}))
    if REAL in names:
        wb.probe_request = replace(wb.probe_request, n_seqs=REAL_PROMPTS)
    dash_duo.start_server(create_app(wb), navigate=False, port=free_port(), start_timeout=30)
    driver = dash_duo.driver
    driver.set_window_size(1440, 1000)
    for page in PAGES:
        where = f"{page.PATH} with {served}"
        graphs, notes = open_working_view(dash_duo, dash_duo.server.url + page.PATH, where)
        why = ALONE_SAYS.get(page.PATH) if names == (REAL,) else None
        if why is not None:  # nothing to draw by design: the page says why
            said = " ".join(notes) + " " + driver.find_element(By.TAG_NAME, "body").text
            assert why in said, f"{where}: does not say {why!r}"
        else:
            assert any(g["traces"] for g in graphs), f"{where}: no figure drew any data"
        if names == NAMES:  # what `make demo` opens on, for a reader to look at
            full_screenshot(driver, SHOTS / f"default-{page.PATH.strip('/') or 'overview'}.png")
