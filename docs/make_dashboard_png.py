"""Regenerate docs/dashboard.png, the README's picture: the Attention page on the default pair
(SMELT, layer 1, second visit, head 3, the default prompt) in headless Chromium.

    python docs/make_dashboard_png.py [--ckpt-dir runs/dyck-pair]"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the repo root, for tests/helpers/browser.py

from smelt_interp.checkpoint import read_payload  # noqa: E402
from smelt_interp.cli import ArgumentParser, run_cli  # noqa: E402
from tests.helpers.browser import (  # noqa: E402
    chrome,
    free_port,
    full_screenshot,
    start_server,
    stop_server,
    wait_settled,
)

VIEW = "/attention?model=smelt&layer=1&visit=1&head=3"


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", default="runs/dyck-pair")
    p.add_argument("--out", default=str(Path(__file__).with_name("dashboard.png")))
    args = p.parse_args(argv)
    ckpts = [Path(args.ckpt_dir) / arch / "ckpt.pt" for arch in ("baseline", "smelt")]
    for ckpt in ckpts:
        read_payload(
            ckpt
        )  # a missing or unreadable checkpoint is one line, before any browser starts
    port = free_port()
    server = start_server(ckpts, port)
    driver = chrome()
    try:
        driver.get(f"http://127.0.0.1:{port}{VIEW}")
        wait_settled(driver)
        full_screenshot(driver, Path(args.out))
    finally:
        driver.quit()
        stop_server(server)
    print(args.out)
    return 0


if __name__ == "__main__":
    run_cli(main)
