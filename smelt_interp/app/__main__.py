"""`python -m smelt_interp.app [CKPT ...] [--host 127.0.0.1] [--port 8050]`: the dashboard.

CKPT arguments are checkpoint files or folders searched for ckpt.pt (a model is named after its
folder, e.g. baseline, smelt), or transformers model folders; a dense one's name may carry a
loop at inference, FOLDER@START:END[xR] (served as e.g. smollm2-135m@12:18x2). With none, the
demo pairs are served beside the real pretrained model (models/smollm2-135m, prepared in the
background by `python -m smelt_interp.commands.real_lm` when missing, log in
runs/real-lm/train.log), the associative-recall
pair runs/recall-pair/{baseline,smelt} (the quicker to train) and the default
pair runs/dyck-pair/{baseline,smelt}: the server starts at once and the models they lack train
in the background, the recall pair first, one
`python -m smelt_interp.train --resume` process at a time (smelt_interp.app.jobs), watched on
the Runs page; Ctrl-C stops the server and the trainer, and the next start resumes it. The Runs
page also lists the run folders found under --runs (default runs/). Only these checkpoints and
folders are ever opened. The server
binds 127.0.0.1 unless --host says otherwise. It serves concurrent users from threads: one model
runs one forward pass at a time, different models and cached answers in parallel, so torch gets
the usable cores divided among the served models unless --threads says otherwise."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence
from pathlib import Path

from smelt_interp.app.served import Served
from smelt_interp.cli import ArgumentParser, run_cli
from smelt_interp.errors import SmeltError
from smelt_interp.provenance import CKPT_FILE
from smelt_interp.resources import parse_device

MAX_THREADS = 1024
REAL_LM = "smollm2-135m"  # the real pretrained model's name on the pages


def parse_args(argv: Sequence[str] | None = None):
    p = ArgumentParser(
        prog="python -m smelt_interp.app",
        description="Dash dashboard for looking inside SMELT and Baseline checkpoints.",
    )
    p.add_argument(
        "ckpt",
        nargs="*",
        metavar="CKPT",
        help="checkpoint files, folders holding ckpt.pt files, or transformers folders of looped "
        "models (hrm_text, dory, inkling2_loop) or dense ones (llama, mistral; FOLDER@12:18x2 "
        "loops layers 12..17 twice at inference); default: runs/recall-pair and "
        "runs/dyck-pair, trained in the background if missing, the recall pair first, and "
        "models/smollm2-135m, prepared beside them",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let a model folder run the modeling file it ships (its architecture must still be "
        "one the adapter knows)",
    )
    p.add_argument(
        "--runs",
        default="runs",
        metavar="DIR",
        help="folder whose run folders the Runs page lists (default runs; a missing one is fine)",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, this machine only)"
    )
    p.add_argument("--port", type=int, default=8050, help="port (default 8050)")
    p.add_argument(
        "--device", default="cpu", help="torch device for the models: cpu (default) or cuda[:N]"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: the usable cores divided among the models)",
    )
    p.add_argument("--debug", action="store_true", help="Dash debug mode (dev tools, reloader off)")
    return p.parse_args(argv)


def _check_port(host: str, port: int) -> None:
    """Fail early, in one line, when the address cannot be bound (port taken, unknown host)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise SmeltError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            raise SmeltError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None


def default_threads(n_models: int) -> int:
    """Torch threads per forward pass when up to `n_models` run at once (one per model)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, n_models))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not 0 < args.port < 65536:
        raise SmeltError(f"--port must be 1..65535, got {args.port}")
    if args.threads is not None and not 1 <= args.threads <= MAX_THREADS:
        raise SmeltError(f"--threads must be 1..{MAX_THREADS}, got {args.threads}")
    device = parse_device(args.device)  # before any checkpoint is opened or trained
    import torch

    from smelt_interp.app.jobs import JobRunner, real_lm_command
    from smelt_interp.app.pages import runs as runs_page
    from smelt_interp.app.registry import ModelRegistry, find_checkpoints, on_disk
    from smelt_interp.app.server import create_app

    _check_port(args.host, args.port)
    if args.ckpt:
        paths, jobs, prepare = find_checkpoints(args.ckpt), [], []
    else:
        paths, jobs = default_pair()
        prepare = real_model(paths)
    runner = JobRunner(jobs).queue()  # the registry then sees the jobs' folders as queued runs
    # the real model's preparation runs beside the training, not after it
    preparing = JobRunner(prepare, command=real_lm_command() if prepare else []).queue()
    pending_jobs = {name: job.run_dir for name in paths for job in prepare if name == REAL_LM}
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started in the background by a shell without job control, the server inherits SIGINT
        # ignored and would hand that to its trainers: the stop they are sent would do nothing.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # restored on the way out: an ignored signal would be inherited by every later child
    previous = {sig: signal.getsignal(sig) for sig in stop_signals}
    for sig in (signal.SIGTERM, signal.SIGHUP):  # stop as Ctrl-C does: the trainer with us
        signal.signal(sig, _interrupt)
    try:
        torch.set_num_threads(args.threads or default_threads(len(paths)))
        registry = ModelRegistry(
            paths, device=str(device), allow_remote_code=args.trust_remote_code, jobs=pending_jobs
        )
        # a run's checkpoint sits in its run folder; a transformers model folder is no run
        runs = [p.parent for n, p in paths.items() if not on_disk(p).is_dir() and n != REAL_LM]
        runs_page.watch(runs, root=Path(args.runs))
        app = create_app(Served(registry))
        ready = set(registry.names)
        for name, path in paths.items():
            print(f"  {name:<12} {path}{'' if name in ready else '  (training)'}", flush=True)
        shown = f"[{args.host}]" if ":" in args.host else args.host
        print(f"smelt-interp dashboard: http://{shown}:{args.port}/  (Ctrl+C to stop)", flush=True)
        if jobs:
            where = ", ".join(str(job.run_dir) for job in jobs)
            print(
                f"training in the background, one at a time: {where} (log: train.log in each); "
                f"watch it at http://{shown}:{args.port}{runs_page.PATH}",
                flush=True,
            )
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        runner.start()
        preparing.start()
        app.run(host=args.host, port=args.port, debug=args.debug, use_reloader=False, threaded=True)
    except OSError as exc:
        raise SmeltError(
            f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}"
        ) from None
    finally:
        for sig in stop_signals:  # the stop is not cut short
            signal.signal(sig, signal.SIG_IGN)
        try:
            if runner.current is not None:
                print("stopping the background training (it resumes on the next start)", flush=True)
            runner.stop()
            preparing.stop()
        finally:
            for sig, handler in previous.items():
                if handler is not None:  # None: set outside Python, left as it is
                    signal.signal(sig, handler)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def default_pair() -> tuple[dict[str, Path], list]:
    """The demo pairs' checkpoint paths (app.jobs.DEMO_PAIRS, in order: the recall pair, then
    the default Dyck pair) and a training job for each model not finished, queued in that
    order; none for a pair another process is training (`make train`, an earlier server): it is
    watched. The Dyck pair's models keep their names (baseline, smelt); the others are named
    after their pair (baseline-recall, smelt-recall)."""
    from smelt_interp.app.jobs import DEMO_PAIRS, pair_jobs
    from smelt_interp.config import ARCHS
    from smelt_interp.train.progress import run_progress

    paths: dict[str, Path] = {}
    jobs = []
    for preset, root, suffix in DEMO_PAIRS:
        pair = {arch: root / arch / CKPT_FILE for arch in ARCHS}
        paths |= {f"{arch}{suffix}": path for arch, path in pair.items()}
        states = {arch: run_progress(p.parent).state for arch, p in pair.items()}
        if "training" in states.values():
            print(f"{root} is being trained by another process; watching it", flush=True)
            continue
        missing = [arch for arch, state in states.items() if state != "finished"]
        jobs += pair_jobs(root, preset, missing)
    return paths, jobs


def real_model(paths: dict[str, Path]) -> list:
    """Add the real pretrained model (adapters.real_lm.FOLDER) to `paths` as REAL_LM; the job
    that prepares it (app.jobs.real_lm_job) when its folder is not complete yet, else none."""
    from smelt_interp.adapters.real_lm import FOLDER, is_ready
    from smelt_interp.app.jobs import real_lm_job

    paths[REAL_LM] = FOLDER
    if is_ready(FOLDER):
        return []
    print(f"preparing the real model ({REAL_LM}) into {FOLDER} in the background", flush=True)
    return [real_lm_job(FOLDER)]


if __name__ == "__main__":
    run_cli(main)
