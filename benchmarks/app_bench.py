"""Dashboard latency, two cases on a trained pair.

Browser: in a real headless Chromium, from a click on a head or a visit to the redrawn focused
heatmap, and from a new prompt (Run) to all three attention figures redrawn. Times are taken in
the page (performance.now() at the click, Plotly's plotly_afterplot event on each figure), so
they include the callback round trip, the server's work and the browser's drawing. Needs
selenium and chromedriver on PATH.

Concurrent: the dashboard command as users start it, and CLIENTS threads each posting REQUESTS
Dyck case-study callbacks (a new held-out prompt each, so every request runs both models);
latency per request (median, p95) and throughput. `--before DIR` first runs the same load on
the code in DIR (e.g. a checkout of main) for a before/after in one run.

    python -m benchmarks.app_bench [--ckpt-dir runs/dyck-pair] [--repeats 10] [--quick]
        [--case all|browser|concurrent] [--clients 8] [--requests 25] [--before DIR]

Prints a skip line when the checkpoints (or, for the browser case, selenium) are missing."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
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
    from smelt_interp.data.dyck import DyckSpec, dyck_max_len, make_dataset

    spec = DyckSpec(max_len=min(dyck_max_len(max_seq_len, 3), 16))
    return [ex.text for ex in make_dataset(n, spec=spec, n_demos=3, seed=1234, split="heldout")]


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(round(q * (len(sorted_values) - 1))))]


def serve(repo: Path, ckpt_dir: Path, port: int, log: Path) -> subprocess.Popen:
    """`python -m smelt_interp.app ckpt_dir` run from the code in `repo`, once it answers."""
    cmd = [sys.executable, "-m", "smelt_interp.app", str(ckpt_dir), "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONUNBUFFERED": "1"}
    from tests.helpers.browser import wait_until_serving

    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT)
    wait_until_serving(proc, f"http://127.0.0.1:{port}/", 300, log)
    return proc


def _post(url: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as resp:
        return resp.read()


def dyck_body(base: str) -> dict:
    """The Dyck results callback's request, found in the server's callback list (its outputs
    may change; its input is the store of the prompt last run)."""
    from dash._utils import split_callback_id

    with urllib.request.urlopen(base + "/_dash-dependencies", timeout=60) as resp:
        deps = json.loads(resp.read())
    dep = next(
        d
        for d in deps
        if [(i["id"], i["property"]) for i in d["inputs"]] == [("dyck-applied", "data")]
        and "dyck-results" in d["output"]
    )
    outputs = [
        {
            "id": json.loads(o["id"]) if o["id"].startswith("{") else o["id"],
            **{"property": o["property"]},
        }
        for o in split_callback_id(dep["output"])
    ]
    return {
        "output": dep["output"],
        "outputs": outputs,
        "state": [],
        "changedPropIds": ["dyck-applied.data"],
    }


def concurrent(repo: Path, ckpt_dir: Path, texts: list[str], clients: int) -> dict:
    """Latencies (ms) of `clients` threads posting the Dyck callback, texts split among them."""
    sys.path.insert(0, str(REPO))
    from tests.helpers.browser import free_port, stop_server

    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="app_bench_")) / "server.log"
    proc = serve(repo, ckpt_dir.resolve(), port, log)
    base = f"http://127.0.0.1:{port}"
    times: list[float] = []
    errors: list[str] = []
    try:
        template = dyck_body(base)

        def client(mine: list[str]) -> None:
            for text in mine:
                body = {
                    **template,
                    "inputs": [{"id": "dyck-applied", "property": "data", "value": text}],
                }
                t0 = time.perf_counter()
                try:
                    ok = b"dyck-results" in _post(base + "/_dash-update-component", body)
                    times.append((time.perf_counter() - t0) * 1000)
                    if not ok:
                        errors.append("no results")
                except OSError as exc:
                    errors.append(type(exc).__name__)

        start = time.perf_counter()
        threads = [
            threading.Thread(target=client, args=(texts[c::clients],)) for c in range(clients)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
    finally:
        stop_server(proc)
    return {"times": times, "errors": errors, "wall_s": wall}


def _concurrent_line(label: str, result: dict) -> str:
    ok = sorted(result["times"])
    if not ok:
        return f"{label:<44} failed: {result['errors'][:3]}"
    n = len(ok) + len(result["errors"])
    return (
        f"{label:<44} median {statistics.median(ok):7.0f} ms   p95 {_percentile(ok, 0.95):7.0f} ms"
        f"   {n / result['wall_s']:5.1f} req/s   errors {len(result['errors'])}/{n}"
    )


def run_concurrent(ckpt_dir: Path, args: argparse.Namespace, max_seq_len: int) -> None:
    from smelt_interp.data.dyck_text import generate_dyck

    n = args.clients * args.requests
    texts = [generate_dyck(4, 4, 2, 1000 + i, max_seq_len) for i in range(n)]
    runs = [("before", Path(args.before).resolve())] if args.before else []
    runs.append(("after", REPO))
    print(
        f"concurrent: {args.clients} clients x {args.requests} Dyck requests, "
        f"{len(set(texts))} distinct prompts, mean {statistics.mean(map(len, texts)):.0f} chars"
    )
    results = {}
    for label, repo in runs:
        results[label] = concurrent(repo, ckpt_dir, texts, args.clients)
        print(_concurrent_line(f"Dyck callback, {label} ({repo})", results[label]), flush=True)
    print(json.dumps({k: [round(t, 1) for t in v["times"]] for k, v in results.items()}))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.app_bench", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--ckpt-dir", default="runs/dyck-pair", help="folder of the pair's ckpt.pt files"
    )
    p.add_argument("--repeats", type=int, default=10, help="clicks per measurement (default 10)")
    p.add_argument("--quick", action="store_true", help="3 repeats; 8 clients x 5 requests")
    p.add_argument("--case", choices=("all", "browser", "concurrent"), default="all")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    p.add_argument("--requests", type=int, default=25, help="requests per client (default 25)")
    p.add_argument("--before", help="also run the concurrent case on the code in this folder")
    args, _ = p.parse_known_args(argv)
    repeats = 3 if args.quick else max(1, args.repeats)
    args.clients, args.requests = max(1, args.clients), 5 if args.quick else max(1, args.requests)

    ckpt_dir = Path(args.ckpt_dir)
    if not (ckpt_dir.is_dir() and any(ckpt_dir.rglob("ckpt.pt"))):
        print(
            f"app_bench: skipped, no checkpoints under {ckpt_dir} "
            "(train: python -m smelt_interp.train --preset dyck-pair)"
        )
        return 0
    if args.case != "browser":
        from smelt_interp.app.registry import ModelRegistry, find_checkpoints

        registry = ModelRegistry(find_checkpoints([ckpt_dir]))
        run_concurrent(ckpt_dir, args, min(registry.cfg(n).max_seq_len for n in registry.names))
        if args.case == "concurrent":
            return 0
    if importlib.util.find_spec("selenium") is None:
        print("app_bench: skipped, selenium is not installed (pip install 'dash[testing]')")
        return 0
    if not shutil.which("chromedriver"):
        print("app_bench: skipped, chromedriver is not on PATH (make browser)")
        return 0

    sys.path.insert(0, str(REPO))  # the selenium helpers live in tests/helpers/browser.py
    from smelt_interp.app.registry import ModelRegistry, find_checkpoints
    from tests.helpers.browser import chrome, free_port, start_server, stop_server, wait_settled

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
