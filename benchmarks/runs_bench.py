"""The Runs page on long logs: redraw time and memory over an hour of polling.

Two runs (a Baseline and a SMELT folder) each get a metrics.jsonl of LINES lines shaped as the
trainer writes them (train records, and every 100 steps an eval record with three held-out
losses and the sink per (layer, visit) of a 6-visit SMELT). The page's refresh callback is
called through the app's own endpoint (Flask's test client: the guard, the callback, the JSON
encoding; not the browser's drawing):

- first refresh: both logs read from the start (the cost of opening the page once);
- redraw: a train line appended to each log, then a refresh, which reads the new bytes and
  rebuilds the curves (median and p90 over the repeats); at an eval: an eval line appended,
  which rebuilds the sink figure too;
- no news: a refresh with nothing appended (the figures are kept);
- memory: POLLS refreshes (1,200 = an hour at the page's 3 s), each after a new line in each
  log, with the process's RSS before and after and the Python heap's growth (tracemalloc).

    python -m benchmarks.runs_bench [--lines 100000] [--polls 1200] [--repeats 20] [--quick]"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

VISITS = [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (3, 0)]
DOMAINS = ("dyck", "trigger", "code")


def train_record(step: int) -> dict:
    return {
        "event": "train",
        "step": step,
        "tokens": step * 8192,
        "tokens_per_s": 9000.0 + step % 97,
        "loss": 2.0 + 1.0 / step,
        "load_balance": 1.01,
        "z_loss": 0.3,
        "grad_norm": 0.8,
        "lr": 1e-3,
    }


def eval_record(step: int) -> dict:
    rec = {"event": "eval", "step": step, "tokens": step * 8192}
    rec |= {f"loss/{d}": 1.5 + 1.0 / step for d in DOMAINS}
    rec |= {f"sink_mass/{layer}.{visit}": 0.4 for layer, visit in VISITS}
    return rec | {"sink03_64": 0.5, "dyck_exact_match": 0.9}


def write_log(path: Path, lines: int) -> int:
    """A log of `lines` lines; the last step written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    step, n = 0, 0
    with open(path, "w") as fh:
        while n < lines:
            step += 1
            fh.write(json.dumps(train_record(step)) + "\n")
            n += 1
            if step % 100 == 0 and n < lines:
                fh.write(json.dumps(eval_record(step)) + "\n")
                n += 1
    return step


def make_client(root: Path, given: Sequence[Path] = ()):
    """(refresh, the store's id) of a dashboard watching `given` and the runs under `root`:
    refresh(seen) -> (seconds, response) through the app's callback endpoint, `seen` being the
    value of the page's store (what the figures were drawn from)."""
    from dash._utils import split_callback_id

    from smelt_interp.app.pages import runs as runs_page
    from smelt_interp.app.registry import ModelRegistry
    from smelt_interp.app.served import Served
    from smelt_interp.app.server import create_app

    runs_page.watch(given, root=root)
    app = create_app(Served(ModelRegistry.from_models({})))
    key = next(k for k in app.callback_map if f"{runs_page.TABLE}.children" in k)
    outputs = [
        {
            "id": json.loads(p["id"]) if p["id"].startswith("{") else p["id"],
            "property": p["property"],
        }
        for p in split_callback_id(key)
    ]
    client = app.server.test_client()

    def refresh(seen: str | None) -> tuple[float, dict]:
        body = {
            "output": key,
            "outputs": outputs,
            "inputs": [{"id": runs_page.TICK, "property": "n_intervals", "value": 1}],
            "state": [{"id": runs_page.SEEN, "property": "data", "value": seen}],
            "changedPropIds": [f"{runs_page.TICK}.n_intervals"],
        }
        t0 = time.perf_counter()
        r = client.post(
            "/_dash-update-component", data=json.dumps(body), content_type="application/json"
        )
        seconds = time.perf_counter() - t0
        if r.status_code != 200:
            raise RuntimeError(f"refresh answered {r.status_code}: {r.data[:300]!r}")
        return seconds, r.get_json()["response"]

    return refresh, runs_page.SEEN


def _ms(times: Sequence[float]) -> str:
    ok = sorted(times)
    p90 = ok[min(len(ok) - 1, int(round(0.9 * (len(ok) - 1))))]
    return f"median {statistics.median(ok) * 1e3:7.1f} ms   p90 {p90 * 1e3:7.1f} ms   n={len(ok)}"


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.runs_bench", description=__doc__)
    p.add_argument("--lines", type=int, default=100_000, help="lines in each run's log")
    p.add_argument("--polls", type=int, default=1200, help="refreshes for the memory figure")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="10k lines, 200 polls, 5 repeats")
    args = p.parse_args(argv)
    if args.quick:
        args.lines, args.polls, args.repeats = 10_000, 200, 5
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        logs = [root / "pair" / arch / "metrics.jsonl" for arch in ("baseline", "smelt")]
        steps = [write_log(log, args.lines) for log in logs]
        size = sum(log.stat().st_size for log in logs) / 2**20
        print(f"2 runs x {args.lines:,} lines ({size:.0f} MiB of metrics.jsonl)", flush=True)
        refresh, seen_id = make_client(root)

        def append() -> None:
            for i, log in enumerate(logs):
                steps[i] += 1
                with open(log, "a") as fh:
                    fh.write(json.dumps(train_record(steps[i])) + "\n")

        first, response = refresh(None)
        seen = response[seen_id]["data"]
        print(f"{'first refresh (reads both logs)':<40} {first * 1e3:9.1f} ms", flush=True)
        redraws, quiet = [], []
        for _ in range(args.repeats):
            append()
            t, response = refresh(seen)
            seen = response[seen_id]["data"]
            redraws.append(t)
            quiet.append(refresh(seen)[0])
        print(f"{'redraw (a new line in each log)':<40} {_ms(redraws)}", flush=True)
        evals = []
        for _ in range(args.repeats):
            for i, log in enumerate(logs):
                with open(log, "a") as fh:
                    fh.write(json.dumps(eval_record(steps[i])) + "\n")
            t, response = refresh(seen)
            seen = response[seen_id]["data"]
            evals.append(t)
        print(f"{'redraw at an eval (both figures)':<40} {_ms(evals)}", flush=True)
        print(f"{'refresh with nothing new':<40} {_ms(quiet)}", flush=True)

        gc.collect()
        tracemalloc.start()
        base_heap = tracemalloc.get_traced_memory()[0]
        base_rss = rss_mib()
        marks = []
        for i in range(1, args.polls + 1):
            append()
            _, response = refresh(seen)
            seen = response[seen_id]["data"]
            if i % max(1, args.polls // 4) == 0:
                gc.collect()
                heap = (tracemalloc.get_traced_memory()[0] - base_heap) / 2**20
                marks.append(f"{i}: RSS {rss_mib():.0f} MiB, heap {heap:+.2f} MiB")
        tracemalloc.stop()
        print(f"memory over {args.polls} refreshes (RSS before {base_rss:.0f} MiB)", flush=True)
        for mark in marks:
            print(f"  after {mark}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
