"""`python -m smelt_interp.app HF_FOLDER` serves it: every page's default URL opens on a working
view, in a real headless Chromium, for each tiny transformers looped model (hrm_text, dory,
inkling2_loop; helpers.tiny_looped, ids only) alone and for the three beside a demo SmeltModel
checkpoint: a figure drew data, no error message, nothing in the browser console. Where a view
has nothing to draw by design it must say why instead: the routing page of dense models (no
routed experts), the case study of models without a tokenizer (no text prompt to pose) and the
Runs page of model folders (no training log). One server per served set; screenshots of each
in test-artifacts/screenshots/adapted-{set}-{page}.png."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.browser import (
    free_port,
    full_screenshot,
    open_working_view,
    require_chromedriver,
)
from helpers.demo_models import demo_checkpoints
from helpers.tiny_looped import ARCHS, tiny_folders

require_chromedriver()

from selenium.webdriver.common.by import By  # noqa: E402

from smelt_interp.app.pages import PAGES  # noqa: E402
from smelt_interp.app.pages import runs as runs_page  # noqa: E402
from smelt_interp.app.registry import ModelRegistry, find_checkpoints  # noqa: E402
from smelt_interp.app.served import Served  # noqa: E402
from smelt_interp.app.server import create_app  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
BESIDE = "smelt"  # the demo checkpoint served beside the folders
SERVED = {
    **{f"{arch} alone": (arch,) for arch in ARCHS},
    "the three beside smelt": (*ARCHS, BESIDE),
}
DENSE = ("hrm_text", "dory")  # no router: the routing page says so
# page path -> (whether the served set has nothing to draw there, what the page says instead)
NOTHING_TO_DRAW = {
    "/routing": (lambda names: set(names) <= set(DENSE), "no routed experts"),
    "/case-study": (lambda names: BESIDE not in names, "no tokenizer"),
    "/runs": (lambda names: BESIDE not in names, "not a run of this project's trainer"),
}


@pytest.fixture(scope="module")
def served_paths(tmp_path_factory) -> dict[str, Path]:
    """The three folders and the demo's smelt checkpoint, by served name."""
    folders = tiny_folders(tmp_path_factory.mktemp("folders"))
    smelt = demo_checkpoints(tmp_path_factory.mktemp("demo"))[BESIDE]
    return {**find_checkpoints(folders.values()), BESIDE: smelt}


@pytest.mark.parametrize("served", list(SERVED))
def test_every_page_opens_on_a_working_view(dash_duo, served_paths, served, monkeypatch):
    from tqdm import tqdm

    monkeypatch.setattr(tqdm, "monitor_interval", 0)  # dash_duo stops every thread it finds
    names = SERVED[served]
    runs_page.watch([served_paths[n].parent for n in names if n == BESIDE], root=None)
    wb = Served(ModelRegistry({n: served_paths[n] for n in names}))
    dash_duo.start_server(create_app(wb), navigate=False, port=free_port(), start_timeout=30)
    driver = dash_duo.driver
    driver.set_window_size(1440, 1000)
    for page in PAGES:
        where = f"{page.PATH} with {served}"
        graphs, notes = open_working_view(dash_duo, dash_duo.server.url + page.PATH, where)
        empty, why = NOTHING_TO_DRAW.get(page.PATH, (lambda _: False, ""))
        if empty(names):
            said = " ".join(notes) + " " + driver.find_element(By.TAG_NAME, "body").text
            assert why in said, f"{where}: does not say {why!r}"
        else:
            assert any(g["traces"] for g in graphs), f"{where}: no figure drew any data"
        # what each served set opens on, for a reader to look at
        tag = "mixed" if len(names) > 1 else names[0]
        full_screenshot(driver, SHOTS / f"adapted-{tag}-{page.PATH.strip('/') or 'overview'}.png")
