"""The dashboard under load: USERS simulated users for SECONDS against the real server.

The server is `python -m smelt_interp.app CKPT_DIR` as users start it (a separate process,
threaded werkzeug). Each user loops: pick a page; load it as a browser does (GET the page,
then Dash's page-router callback that draws it); then send the callbacks that page's controls
fire, each with the values the default layout holds or, VARY of the time, varied ones (another
model, layer, visit, head, token, recall row or prompt, as a user clicking around would); then
think for a moment. Latencies are per request, grouped as page loads, model-running callbacks
(attention grid and focus, routing token, recall example) and other callbacks. The server's
resident memory is sampled at the start (after a warm-up round) and at the end.

With no --ckpt-dir, the recall pair's models (the preset's architecture, untrained weights:
the serving work is the same) are written to a temporary folder and served, each with the
metrics.jsonl a trained run of the preset leaves beside its checkpoint (write_log: a train
record every step, an evaluation every eval_every steps with every head's case-study masses and
every visit's sink mass, measured by the trainer's own evaluations on the model and drifting
over the steps), so the pages that draw a run's log (the Case study's over-training figure,
the Overview's sink over training) do the work they do for a user's trained runs.

    python -m benchmarks.load_bench [--ckpt-dir DIR] [--users 32] [--seconds 180] [--vary 0.3]
        [--quick] [--passes 1] [--against OTHER_CHECKOUT]

Prints one summary line per group and a JSON record of the figures. With --against, the other
checkout's own load_bench runs first on the same checkpoints and arguments (its server, its
pages' requests), then this one, back to back, and the p95 ratios (other / this) are printed:
the machine's load moves an absolute p95, so only figures measured side by side compare."""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
UPDATE = "/_dash-update-component"
PAGES_CONTENT = "_pages_content.children"
MODEL_CALLBACKS = ("attn-grid", "attn-focus", "routing-token", "recall")  # run a model
THINK_S = (0.2, 1.0)  # a user's pause between actions


def write_log(run_dir: Path, model: Any, cfg: Any) -> Path:
    """`run_dir`/metrics.jsonl as a run of `cfg` writes it over its whole schedule: a train
    record each step, an eval record each eval_every steps holding the trainer's case-study
    (train.case_eval.heldout_case) and sink (train.sink_eval.heldout_sink) keys of `model` on
    held-out recall rows, each value moved along a smooth per-key drift so the curves differ
    from step to step as a trained run's do."""
    import math

    from smelt_interp.data.assoc_recall import recall_rows
    from smelt_interp.train.case_eval import heldout_case
    from smelt_interp.train.sink_eval import heldout_sink

    spec, length = cfg.corpus.assoc_recall, cfg.batch.seq_len
    rows = recall_rows(12, length, seed=0, spec=spec, split="heldout")
    measured = {**heldout_case(model, rows, spec), **heldout_sink(model, rows)}
    steps, every = cfg.schedule.steps, cfg.eval.every
    lines = []
    for step in range(1, steps + 1):
        tokens = step * cfg.tokens_per_step
        loss = 3.3 * math.exp(-step / 400) + 0.4
        lines.append({"event": "train", "step": step, "tokens": tokens, "loss": loss, "lr": 1e-2})
        if step % every == 0 or step == steps:
            drift = {
                key: min(1.0, max(0.0, value + 0.2 * math.sin(step / 150 + i)))
                for i, (key, value) in enumerate(measured.items())
            }
            lines.append({"event": "eval", "step": step, "tokens": tokens, "loss": loss, **drift})
    path = run_dir / "metrics.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def write_pair(folder: Path) -> Path:
    """The recall pair's two models, untrained, as the trainer saves them, under `folder`,
    each with the metrics.jsonl of its preset's whole run (write_log)."""
    import torch

    from smelt_interp.checkpoint import save_checkpoint
    from smelt_interp.model.transformer import SmeltModel
    from smelt_interp.train.config import TrainConfig
    from smelt_interp.train.presets import get_preset
    from smelt_interp.train.trainer import pair_configs

    torch.manual_seed(0)
    for arch, cfg in pair_configs(TrainConfig.from_dict(get_preset("recall-pair"))).items():
        model = SmeltModel(cfg.model_config()).eval()  # the SMELT run's matched shape too
        save_checkpoint(
            folder / arch / "ckpt.pt",
            model,
            arch=arch,
            step=cfg.schedule.steps,
            final=True,
            train_config=cfg.to_dict(),
        )
        write_log(folder / arch, model, cfg)
    return folder


def _walk(component: Any) -> Iterator[Any]:
    if not hasattr(component, "to_plotly_json"):
        return
    yield component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        yield from _walk(child)


def _id(text: str) -> Any:
    return json.loads(text) if text.startswith("{") else text


def plan(ckpt_dir: Path) -> tuple[list[dict], dict[str, Any], list[str]]:
    """(one entry per page: path, its page-load body, its callbacks' bodies; the values the
    default layouts hold; the served model names), from an app built over the same files."""
    from dash._utils import split_callback_id

    from smelt_interp.app.controls import stringify_id
    from smelt_interp.app.pages import PAGES
    from smelt_interp.app.registry import ModelRegistry, find_checkpoints
    from smelt_interp.app.served import Served
    from smelt_interp.app.server import create_app

    wb = Served(ModelRegistry(find_checkpoints([ckpt_dir])))
    app = create_app(wb)
    app.server.test_client().get("/")  # Dash registers its page router on the first request

    def outputs(key: str) -> Any:
        parts = split_callback_id(key)
        many = parts if isinstance(parts, list) else [parts]
        one = [{"id": _id(p["id"]), "property": p["property"]} for p in many]
        return one if isinstance(parts, list) else one[0]

    def body(key: str, cb: dict, values: dict[str, Any]) -> dict:
        out: dict[str, Any] = {"output": key, "outputs": outputs(key), "inputs": [], "state": []}
        for where in ("inputs", "state"):
            for dep in cb[where]:
                prop = f"{dep['id']}.{dep['property']}"
                entry = {"id": _id(dep["id"]), "property": dep["property"]}
                out[where].append({**entry, "value": values.get(prop)})
        out["changedPropIds"] = [f"{d['id']}.{d['property']}" for d in cb["inputs"][:1]]
        return out

    router = next(k for k, cb in app.callback_map.items() if PAGES_CONTENT in k)
    pages = []
    all_values: dict[str, Any] = {}
    for page in PAGES:
        values: dict[str, Any] = {
            "_pages_location.pathname": page.PATH,
            "_pages_location.search": "",
            "url.pathname": page.PATH,
            "url.search": "",
        }
        ids = set()
        for c in _walk(page.layout(wb, {})):
            cid = getattr(c, "id", None)
            if cid is None:
                continue
            sid = stringify_id(cid) if isinstance(cid, dict) else cid
            ids.add(sid)
            for prop in ("value", "data", "n_clicks", "n_intervals"):
                if getattr(c, prop, None) is not None:
                    values[f"{sid}.{prop}"] = getattr(c, prop)
        all_values.update(values)
        callbacks = []
        for key, cb in app.callback_map.items():
            if "callback" not in cb or key == router:
                continue
            inputs = [d["id"] for d in cb["inputs"]]
            if inputs and all(i in ids for i in inputs) and "ALL" not in key:
                callbacks.append((key, body(key, cb, values)))
        pages.append(
            {
                "path": page.PATH,
                "load": body(router, app.callback_map[router], values),
                "callbacks": callbacks,
            }
        )
    return pages, all_values, list(wb.registry.names)


class Varier:
    """Varied values for a callback body, as a user changing the controls would send."""

    def __init__(self, names: list[str], seed: int) -> None:
        from smelt_interp.data.dyck_text import generate_dyck

        self.names = names
        self.rng = random.Random(seed)
        self.prompts = [generate_dyck(4, 4, 2, 5000 + i, 128) for i in range(40)]

    def value(self, prop: str, value: Any) -> Any:
        rng = self.rng
        if isinstance(value, str) and value in self.names:
            return rng.choice(self.names)
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, int):
            return rng.randint(0, max(3, value + 3))
        if isinstance(value, str) and "prompt" in prop:
            return rng.choice(self.prompts)
        return value

    def vary(self, body: dict) -> dict:
        out = json.loads(json.dumps(body))
        for where in ("inputs", "state"):
            for entry in out[where]:
                prop = f"{entry['id']}.{entry['property']}"
                entry["value"] = self.value(prop, entry["value"])
        return out


def serve(ckpt_dir: Path, port: int, runs: Path, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "smelt_interp.app", str(ckpt_dir), "--port", str(port)]
    cmd += ["--runs", str(runs)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/"
    end = time.monotonic() + 300
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(base, timeout=5):
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not answer within 300 s")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def request(base: str, path: str, body: dict | None) -> tuple[int, float]:
    """(HTTP status, seconds) of a GET (body None) or a callback POST."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError:
        status = 599  # no answer at all: counted with the server errors
    return status, time.perf_counter() - t0


def kind_of(key: str) -> str:
    return "model callback" if any(k in key for k in MODEL_CALLBACKS) else "other callback"


def short(key: str) -> str:
    """A callback's name for the report: its first output."""
    return key.strip(".").split("...")[0][:40]


by_key: dict[str, list[float]] = {}  # callback -> its latencies (list.append is thread-safe)


def user(base: str, pages: list[dict], varier: Varier, vary: float, until: float, out: list):
    rng = varier.rng
    while time.monotonic() < until:
        page = rng.choice(pages)
        out.append(("page load", *request(base, page["path"], None)))
        out.append(("page load", *request(base, UPDATE, page["load"])))
        for key, body in page["callbacks"]:
            if time.monotonic() >= until:
                return
            sent = varier.vary(body) if rng.random() < vary else body
            status, seconds = request(base, UPDATE, sent)
            out.append((kind_of(key), status, seconds))
            by_key.setdefault(short(key), []).append(seconds)
        time.sleep(rng.uniform(*THINK_S))


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(label: str, rows: list[tuple[str, int, float]]) -> dict:
    times = [t for _, _, t in rows]
    errors = sum(1 for _, status, _ in rows if status >= 500)
    if not times:
        return {"group": label, "n": 0}
    return {
        "group": label,
        "n": len(times),
        "p50_s": round(statistics.median(times), 3),
        "p95_s": round(percentile(times, 0.95), 3),
        "max_s": round(max(times), 3),
        "over_1s": sum(1 for t in times if t > 1.0),
        "5xx": errors,
        "statuses": sorted({s for _, s, _ in rows}),
    }


def run(ckpt_dir: Path, users: int, seconds: float, vary: float, passes: int = 1) -> dict:
    from tests.helpers.browser import free_port

    pages, _, names = plan(ckpt_dir)
    work = Path(tempfile.mkdtemp(prefix="load_bench_"))
    (work / "runs").mkdir()
    port = free_port()
    proc = serve(ckpt_dir, port, work / "runs", work / "server.log")
    base = f"http://127.0.0.1:{port}"
    try:
        warm: list = []  # every page and callback once, so the start figure is a warm server
        user(base, pages, Varier(names, 0), 0.0, time.monotonic() + 1e-9, warm)
        for page in pages:
            for _key, body in page["callbacks"]:
                request(base, UPDATE, body)
        rss_start = rss_mib(proc.pid)
        by_key.clear()
        rows: list = []
        rss_passes = []  # the server's RSS after each pass: flat once its caches are full
        t0 = time.perf_counter()
        for n in range(passes):
            until = time.monotonic() + seconds / passes
            threads = [
                threading.Thread(
                    target=user,
                    args=(base, pages, Varier(names, 1 + i + n * users), vary, until, rows),
                )
                for i in range(users)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rss_passes.append(round(rss_mib(proc.pid), 1))
        wall = time.perf_counter() - t0
        rss_end = rss_passes[-1]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    groups = [summary("all", rows)]
    for label in ("page load", "model callback", "other callback"):
        groups.append(summary(label, [r for r in rows if r[0] == label]))
    return {
        "users": users,
        "seconds": round(wall, 1),
        "vary": vary,
        "requests": len(rows),
        "rss_mib_start": round(rss_start, 1),
        "rss_mib_end": round(rss_end, 1),
        "rss_mib_passes": rss_passes,
        "groups": groups,
        "slowest": sorted(
            ((k, round(percentile(v, 0.95), 3), len(v)) for k, v in by_key.items()),
            key=lambda kv: -kv[1],
        )[:8],
        "load_average": os.getloadavg(),
    }


def run_other(checkout: Path, ckpt_dir: Path, users: int, seconds: float, vary: float) -> dict:
    """The figures of `checkout`'s own load_bench on the same checkpoints and arguments (its
    last line of output is its JSON record)."""
    cmd = [sys.executable, "-m", "benchmarks.load_bench", "--ckpt-dir", str(ckpt_dir)]
    cmd += ["--users", str(users), "--seconds", str(seconds), "--vary", str(vary)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}'s load_bench failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(label: str, result: dict) -> None:
    print(
        f"{label}: {result['users']} users for {result['seconds']} s, "
        f"{result['requests']} requests, load average {result.get('load_average')}"
    )
    for g in result["groups"]:
        if g["n"]:
            print(
                f"  {g['group']:<15} n={g['n']:<6} p50 {g['p50_s']:6.3f} s  p95 {g['p95_s']:6.3f} s"
                f"  max {g['max_s']:6.2f} s  >1s {g['over_1s']:<5} 5xx {g['5xx']}"
            )
    for key, p95, n in result["slowest"]:
        print(f"    {key:<40} p95 {p95:6.3f} s  n={n}")
    after = result.get("rss_mib_passes", [])
    each = f" (after each pass: {', '.join(map(str, after))})" if len(after) > 1 else ""
    print(f"  server RSS {result['rss_mib_start']} -> {result['rss_mib_end']} MiB{each}")


def ratios(other: dict, this: dict) -> dict[str, float]:
    """Per group, the other checkout's p95 over this one's (above 1: this one is faster)."""
    theirs = {g["group"]: g for g in other["groups"] if g["n"]}
    return {
        g["group"]: round(theirs[g["group"]]["p95_s"] / g["p95_s"], 2)
        for g in this["groups"]
        if g["n"] and g["group"] in theirs and g["p95_s"] > 0
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.load_bench", description=__doc__)
    p.add_argument("--ckpt-dir", help="folder of the pair's ckpt.pt files (default: write one)")
    p.add_argument("--users", type=int, default=32)
    p.add_argument("--seconds", type=float, default=180.0)
    p.add_argument("--vary", type=float, default=0.3, help="share of callbacks sent varied")
    p.add_argument("--quick", action="store_true", help="4 users for 10 s")
    p.add_argument(
        "--passes",
        type=int,
        default=1,
        help="split the run into this many passes on the same server, its RSS read after each",
    )
    p.add_argument(
        "--against",
        metavar="CHECKOUT",
        help="another checkout of this project (e.g. the base commit) measured first, back to back",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.users, args.seconds = 4, 10.0
    users, seconds = max(1, args.users), max(1.0, args.seconds)
    sys.path.insert(0, str(REPO))
    other = None
    with tempfile.TemporaryDirectory(prefix="load_bench_ckpt_") as tmp:
        ckpt_dir = Path(args.ckpt_dir) if args.ckpt_dir else write_pair(Path(tmp))
        if args.against:
            other = run_other(Path(args.against).resolve(), ckpt_dir, users, seconds, args.vary)
            report(f"load ({args.against})", other)
        result = run(ckpt_dir, users, seconds, args.vary, max(1, args.passes))
    report("load (this checkout)", result)
    if other is not None:
        result["against"] = {"checkout": str(args.against), "result": other}
        result["p95_ratio"] = ratios(other, result)
        shown = ", ".join(f"{k} {v:g}x" for k, v in result["p95_ratio"].items())
        print(f"  p95 {args.against} / this checkout: {shown}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
