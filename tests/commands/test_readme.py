"""Every command and Python example in the README and its pages (docs/guide.md,
docs/results.md) runs.

Commands run in a sandbox folder where `runs/dyck-pair` (and `runs/mine/...`) point at the
trained tiny pair, `runs/ladder/runs.csv` is a runs table drawn from a known scaling law,
`my_corpus/` holds a text file, `models/inkling2-loop` a tiny random-initialised transformers
looped model with a tokenizer and `models/smollm2-135m` links to the real model `make test`
prepared (`make real-lm`; its commands are skipped, saying so, where it is not prepared). Long
jobs keep their flags but get small sizes appended (`--set steps=...`, `--n-seqs ...`), so the
test checks the interface the README shows, not the hours it would take. A README command no
rule below recognises fails the test: new commands must come with a way to run them."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers.tiny_looped import tiny_folder
from helpers.torchrun import torchrun_attempts

from smelt_interp.adapters.real_lm import FOLDER as REAL_FOLDER
from smelt_interp.adapters.real_lm import manifest_problem

REPO = Path(__file__).resolve().parents[2]
# The README and the pages it links for the rest, read as one text of examples.
README = "\n".join(
    (REPO / page).read_text(encoding="utf-8")
    for page in ("README.md", "docs/guide.md", "docs/results.md")
)
SMALL_TRAIN = [
    "--set",
    "steps=4",
    "--set",
    "warmup_steps=1",
    "--set",
    "eval_every=100",
    "--set",
    "ckpt_every=2",
    "--set",
    "dyck_eval_n=4",
    "--set",
    "eval_rows=2",
    "--set",
    "threads=1",
    "--quiet",
]
SMALL_PROBE = ["--n-seqs", "2", "--seq-len", "64", "--demos", "0,1"]
SMALL_PATCHING = ["--n-rows", "4"]


def code_blocks(language: str) -> list[str]:
    """Each distinct block once (the README's quickstart repeats some of the guide's)."""
    return list(dict.fromkeys(re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)))


def readme_commands(languages: tuple[str, ...] = ("bash",)) -> list[str]:
    commands = []
    for block in [b for language in languages for b in code_blocks(language)]:
        for line in block.splitlines():
            line = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return list(dict.fromkeys(commands))


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory, tiny_pair) -> Path:
    root = tmp_path_factory.mktemp("readme")
    pair = tiny_pair["baseline"].parent.parent
    (root / "runs" / "mine").mkdir(parents=True)
    (root / "runs" / "dyck-pair").symlink_to(pair, target_is_directory=True)
    for arch in ("baseline", "smelt"):
        (root / "runs" / "mine" / arch).symlink_to(pair / arch, target_is_directory=True)
    corpus = root / "my_corpus"
    corpus.mkdir()
    for i in range(30):  # documents split train/held-out by hash, so give it several
        (corpus / f"note{i}.txt").write_text(
            f"Note {i}: the looped layers refine what the first visit wrote.\n" * 40
        )
    rng = np.random.default_rng(0)
    rows = []
    for arch, S, A in (("baseline", 0.6, 400.0), ("smelt", 0.72, 360.0)):
        for F in (2e5, 5e5, 1e6, 2e6):
            for D in (1e6, 4e6, 1.6e7):
                loss = 1.7 + A * (1 - S) ** 0.3 / F**0.35 + 900 / D**0.37
                rows.append(
                    {"arch": arch, "F": F, "S": S, "D": D, "loss": loss * rng.lognormal(0, 0.003)}
                )
    (root / "runs" / "ladder").mkdir()
    pd.DataFrame(rows).to_csv(root / "runs" / "ladder" / "runs.csv", index=False)
    # a looped model from transformers, as a user's folder: tiny, random, with a tokenizer
    tiny_folder(root / "models", "inkling2_loop", "inkling2-loop", tokenizer=True)
    real = REPO / REAL_FOLDER
    if manifest_problem(real) is None:
        (root / REAL_FOLDER).symlink_to(real, target_is_directory=True)
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{shlex.join(argv)}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"
    return proc


def serve_and_fetch(argv: list[str], cwd: Path) -> None:
    """Start the dashboard, wait for it to answer on 127.0.0.1, then stop it."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        argv + ["--port", str(port)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
                    assert resp.status == 200
                    return
            except OSError:
                time.sleep(1)
        raise AssertionError("the dashboard did not answer within 180 s")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def one_node(args: list[str]) -> list[str]:
    """torchrun flags of a several-machine command as this one machine runs them: the rendezvous
    flags dropped (the caller adds --standalone), one node of 2 processes."""
    if "--nnodes" not in args:
        return args
    args = list(args)
    for flag in ("--nnodes", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id"):
        if flag in args:
            del args[args.index(flag) : args.index(flag) + 2]
    args[args.index("--nproc-per-node") + 1] = "2"
    return args


def python_argv(command: str, tmp: Path) -> list[str]:
    """argv for a `python -m ...` or `torchrun ...` README line, shrunk to test size."""
    argv = shlex.split(command)
    if argv[0] == "torchrun":
        argv = [str(Path(sys.executable).parent / "torchrun"), "--standalone", *one_node(argv[1:])]
    else:
        assert argv[0] == "python", command
        argv = [sys.executable, *argv[1:]]
    module = argv[argv.index("-m") + 1]
    if module == "smelt_interp.train" and "eval" in argv:
        argv += ["--n", "4", "--loss-rows", "2", "--threads", "1"]
    elif module == "smelt_interp.train":
        argv = [a if a != "dyck-pair" else "dyck-pair-tiny" for a in argv]
        if "--out" in argv:
            i = argv.index("--out") + 1
            argv[i] = str(tmp / argv[i])
        else:
            argv += ["--out", str(tmp / "train-out")]
        if "ladder" in argv:
            argv += [
                "--set",
                "steps=4",
                "--set",
                "branches=[2]",
                "--set",
                "warmup_steps=1",
                "--set",
                "eval_rows=2",
                "--set",
                "threads=1",
                "--quiet",
            ]
            argv[argv.index("--sizes") + 1] = "1"
        else:
            argv += SMALL_TRAIN
    elif module == "smelt_interp.probes.patching":
        argv += SMALL_PATCHING
    elif module.startswith("smelt_interp.probes.") or module == "smelt_interp.report":
        argv += SMALL_PROBE
    elif module == "smelt_interp.analysis.downstream":
        argv += ["--n-docs", "4", "--n-dyck", "8", "--bootstrap", "10"]
    elif module == "smelt_interp.analysis.scaling":
        argv += ["--bootstrap", "5"]
    return argv


# The path from a folder of Parquet/JSONL files to a trained pair and what reads it: commands
# that name the prepared folder or the pair it trains, run in order in one folder.
REAL_TEXT = [
    c for c in readme_commands(("bash", "sh")) if "shards/" in c or "runs/paper-200m/" in c
]
COMMANDS = [c for c in readme_commands() if c not in REAL_TEXT]
PAPER_SHRINK = [
    f"--set={key}={value}"
    for key, value in {
        "model.d_model": 64,
        "model.n_layers": 4,
        "model.n_heads": 4,
        "model.n_kv_heads": 2,
        "model.d_head": 16,
        "model.n_experts": 4,
        "model.top_k": 2,
        "model.d_expert": 64,
        "model.max_seq_len": 64,
        "d_head_multiple": 2,
        "seq_len": 64,
        "batch_size": 4,
        "grad_accum": 1,
        "branches": "[]",
        "compile": "false",
        "dyck_eval_n": 0,
    }.items()
] + SMALL_TRAIN


def real_text_argv(command: str) -> list[str]:
    """argv of one command of REAL_TEXT at test size (paper-200m's shape shrunk to a tiny one
    that the matcher can pair)."""
    argv = [sys.executable, *shlex.split(command)[1:]]
    module = argv[argv.index("-m") + 1]
    if module == "smelt_interp.train" and "eval" in argv:
        return argv + ["--n", "0", "--loss-rows", "2", "--threads", "1"]
    if module == "smelt_interp.train":
        return argv + PAPER_SHRINK
    if module.startswith("smelt_interp.probes"):
        return argv + SMALL_PROBE
    if module == "smelt_interp.analysis.downstream":
        return argv + ["--n-docs", "4", "--bootstrap", "10"]
    return argv


def test_real_text_path_is_three_commands_that_run_in_order(tmp_path):
    """README: prepare, train, probe; then the guide's evaluation and downstream analysis on
    the same folder, each command's output the next one's input."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    shown = [c for c in REAL_TEXT if c in readme]
    assert [c.split()[2] for c in shown] == ["smelt_interp.data", "smelt_interp.train"] + [
        "smelt_interp.probes"
    ]
    web = tmp_path / "corpus" / "web"
    web.mkdir(parents=True)
    for part in range(3):
        lines = [
            json.dumps({"text": f"Page {part}-{i}: the looped layers refine the first visit. " * 4})
            for i in range(30)
        ]
        (web / f"part{part}.jsonl").write_text("\n".join(lines) + "\n")
    code = [f"def f{i}(x):\n    return x * {i}\n" * 4 for i in range(60)]
    pq.write_table(pa.table({"text": code}), tmp_path / "corpus" / "code.parquet")
    assert len(REAL_TEXT) == 5  # and the guide's evaluation and downstream analysis
    for command in REAL_TEXT:
        proc = run(real_text_argv(command), tmp_path)
        assert proc.stdout.strip() or proc.stderr.strip()
    assert (tmp_path / "runs" / "paper-200m" / "smelt" / "ckpt.pt").is_file()


def test_readme_shows_both_commands_first():
    assert COMMANDS[:2] == ["make demo", "make test"]


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_runs(command, sandbox, tmp_path):
    if str(REAL_FOLDER) in command or command == "make real-lm":
        problem = manifest_problem(REPO / REAL_FOLDER)
        if problem is not None:
            pytest.skip(f"the real model is not prepared ({problem}): make real-lm")
    if command == "make test":
        ci = (REPO / ".ci" / "run").read_text()
        assert "make test" in ci  # CI runs it on every submission
        return
    if command.startswith("make "):
        target = command.split()[1]
        dry = subprocess.run(
            ["make", "-n", "-C", str(REPO), target], capture_output=True, text=True
        )
        assert dry.returncode == 0, dry.stderr
        last = [line for line in dry.stdout.splitlines() if "-m " in line][-1]
        module_argv = shlex.split(last.split("/bin/python", 1)[1])
        if module_argv[:2] == ["-m", "smelt_interp.app"]:
            serve_and_fetch([sys.executable, *module_argv], sandbox)
        elif module_argv[:2] == ["-m", "smelt_interp.commands.real_lm"]:
            # the model `make test` prepared: checked against its manifest, nothing to do
            assert "nothing to do" in run([sys.executable, *module_argv], sandbox).stderr
        else:
            run([sys.executable, *module_argv, "--quick"], sandbox, timeout=900)
        return
    argv = python_argv(command, tmp_path)
    if "smelt_interp.app" in argv:
        serve_and_fetch(argv, sandbox)
        return
    if Path(argv[0]).name == "torchrun":  # loopback rendezvous: one retry, as the DDP tests do
        assert torchrun_attempts(argv, cwd=sandbox, timeout=600).strip()
        return
    proc = run(argv, sandbox)
    assert proc.stdout.strip() or proc.stderr.strip()


@pytest.mark.parametrize("index", range(len(code_blocks("python"))))
def test_readme_python_example_runs(index, sandbox):
    code = code_blocks("python")[index]
    run([sys.executable, "-c", code], sandbox, timeout=300)
