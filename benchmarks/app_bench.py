"""Dashboard latency in a real headless Chromium on a trained pair: from a click on a head or a
visit to the redrawn focused heatmap, and from a new prompt (Run) to all three attention
figures redrawn. Times are taken in the page (performance.now() at the click, Plotly's
plotly_afterplot event on each figure), so they include the callback round trip, the server's
work and the browser's drawing.

    python -m benchmarks.app_bench [--ckpt-dir runs/dyck-pair] [--repeats 10] [--quick]

Needs selenium and chromedriver on PATH; prints a skip line when those or the checkpoints are
missing."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOCUS = ("attn-focus",)
ALL_FIGURES = ("attn-focus", "attn-grid", "attn-visits")

# arguments: graph names, an xpath to click (or null: click #attn-run), done-callback
TIMED_CLICK_JS = """
const names = arguments[0], xpath = arguments[1], done = arguments[arguments.length - 1];
const pending = new Set(names);
const timer = setTimeout(() => done(-1), 60000);
let t0 = 0;
names.forEach(name => {
    const box = document.getElementById(JSON.stringify({name: name, type: 'graph'}));
    const gd = box && box.querySelector('.js-plotly-plot');
    if (!gd) { clearTimeout(timer); done(-2); return; }
    const handler = () => {
        if (!pending.has(name)) return;
        pending.delete(name);
        if (gd.removeListener) gd.removeListener('plotly_afterplot', handler);
        if (pending.size === 0) { clearTimeout(timer); done(performance.now() - t0); }
    };
    gd.on('plotly_afterplot', handler);
});
const target = xpath
    ? document.evaluate(xpath, document, null, XPathResult.FIRST_ORDERED_NODE_TYPE, null)
        .singleNodeValue
    : document.getElementById('attn-run');
t0 = performance.now();
target.click();
"""


def _option(radio: str, text: str) -> str:
    return f"//div[@id='{radio}']//label[normalize-space(.)='{text}']"


def _summary(label: str, times: list[float]) -> str:
    ok = sorted(t for t in times if t >= 0)
    if not ok:
        return f"{label:<44} failed ({len(times)} tries)"
    p90 = ok[min(len(ok) - 1, int(round(0.9 * (len(ok) - 1))))]
    return (
        f"{label:<44} median {statistics.median(ok):7.0f} ms   p90 {p90:7.0f} ms   "
        f"min {ok[0]:6.0f} ms   n={len(ok)}"
        + (f"  ({len(times) - len(ok)} timed out)" if len(ok) < len(times) else "")
    )


def prompts(n: int, max_seq_len: int) -> list[str]:
    """`n` distinct in-context Dyck texts (cache misses for the server)."""
    from smelt_interp.data.dyck import dyck_max_len, make_dataset

    longest = dyck_max_len(max_seq_len, 3)
    return [
        ex.text
        for ex in make_dataset(n, n_demos=3, max_len=min(longest, 16), seed=1234, split="heldout")
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.app_bench", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--ckpt-dir", default="runs/dyck-pair", help="folder of the pair's ckpt.pt files"
    )
    p.add_argument("--repeats", type=int, default=10, help="clicks per measurement (default 10)")
    p.add_argument("--quick", action="store_true", help="3 repeats")
    args, _ = p.parse_known_args(argv)
    repeats = 3 if args.quick else max(1, args.repeats)

    ckpt_dir = Path(args.ckpt_dir)
    if not (ckpt_dir.is_dir() and any(ckpt_dir.rglob("ckpt.pt"))):
        print(
            f"app_bench: skipped, no checkpoints under {ckpt_dir} "
            "(train: python -m smelt_interp.train --preset dyck-pair)"
        )
        return 0
    if importlib.util.find_spec("selenium") is None:
        print("app_bench: skipped, selenium is not installed (pip install 'dash[testing]')")
        return 0
    if not shutil.which("chromedriver"):
        print("app_bench: skipped, chromedriver is not on PATH (make browser)")
        return 0

    sys.path.insert(0, str(REPO))  # the selenium helpers live in tests/browser.py
    from smelt_interp.app.registry import ModelRegistry, find_checkpoints
    from tests.browser import chrome, free_port, start_server, stop_server, wait_settled

    registry = ModelRegistry(find_checkpoints([ckpt_dir]))
    model = registry.valid(None)
    cfg = registry.cfg(model)
    layer = cfg.loop_start if cfg.is_looped else cfg.n_layers // 2
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="app_bench_")) / "server.log"
    print(
        f"app_bench: {model} from {ckpt_dir} ({', '.join(registry.names)}), layer {layer}, "
        f"{repeats} repeats"
    )
    proc = start_server([ckpt_dir], port, log=log)
    driver = chrome()
    results: dict[str, list[float]] = {}
    try:
        base = f"http://127.0.0.1:{port}/attention?model={model}&layer={layer}&visit=0&head=0"
        driver.get(base)
        wait_settled(driver)
        n_heads, n_visits = cfg.n_heads, cfg.visits_of(layer)

        def timed(names, xpath=None) -> float:
            dt = driver.execute_async_script(TIMED_CLICK_JS, list(names), xpath)
            wait_settled(driver, quiet=0.1)
            return float(dt)

        head = 0
        results["head change -> focused heatmap"] = []
        for _ in range(repeats):
            head = (head + 1) % n_heads
            results["head change -> focused heatmap"].append(
                timed(FOCUS, _option("attn-head", str(head)))
            )
        if n_visits > 1:
            visit = 0
            results["visit change -> focused heatmap"] = []
            for _ in range(repeats):
                visit = (visit + 1) % n_visits
                results["visit change -> focused heatmap"].append(
                    timed(FOCUS, _option("attn-visit", str(visit)))
                )

        box = driver.find_element("id", "attn-prompt")
        texts = prompts(repeats, cfg.max_seq_len)
        results["new prompt -> all 3 figures (cache miss)"] = []
        for text in texts:
            driver.execute_script(
                "const el = arguments[0]; const set = Object.getOwnPropertyDescriptor("
                "HTMLTextAreaElement.prototype, 'value').set; set.call(el, arguments[1]);"
                "el.dispatchEvent(new Event('input', {bubbles: true}));",
                box,
                text,
            )
            results["new prompt -> all 3 figures (cache miss)"].append(timed(ALL_FIGURES))
        n_tokens = statistics.mean(len(t.encode()) + 1 for t in texts)
    finally:
        driver.quit()
        stop_server(proc)

    print(f"prompts: in-context Dyck, mean {n_tokens:.0f} tokens")
    for label, times in results.items():
        print(_summary(label, times))
    print(json.dumps({k: [round(t, 1) for t in v] for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
