"""The notebooks (notebooks/*.ipynb): each is saved without outputs, and each runs top to bottom
with nbclient on the tiny trained pair.

The kernel is this interpreter (a kernelspec written into a temp folder and found through
JUPYTER_PATH), started in a temp folder, with SMELT_CKPT_DIR pointing at the `tiny_pair`
fixture, the repository and notebooks/ on PYTHONPATH and bytecode writing off, so executing a
notebook writes nothing into the repository."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXPECTED = [
    "01_quickstart",
    "02_attention_sink",
    "03_routing_similarity",
    "04_interventions",
    "05_case_study",
    "06_scaling",
    "07_looped_transformers",
    "08_patching",
]
KERNEL = "smelt-interp-test"
CELL_TIMEOUT_S = 600


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def test_every_notebook_is_there():
    assert _ids(NOTEBOOKS) == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_saved_without_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "a notebook without code"
    for i, cell in enumerate(code):
        assert cell.outputs == [], f"code cell {i} carries outputs; strip them before saving"
        assert cell.execution_count is None, (
            f"code cell {i} has execution_count {cell.execution_count}"
        )
    assert nb.cells[0].cell_type == "markdown", "the first cell should say what the notebook shows"


@pytest.fixture(scope="session")
def kernel_env(
    tmp_path_factory: pytest.TempPathFactory, tiny_pair: dict[str, Path]
) -> dict[str, str]:
    """Environment for the kernel: a kernelspec running this interpreter, the tiny pair, no
    writes outside temp folders."""
    root = tmp_path_factory.mktemp("kernel")
    spec_dir = root / "jupyter" / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "smelt-interp tests",
                "language": "python",
            }
        )
    )
    pair_dir = tiny_pair["baseline"].parent.parent
    assert tiny_pair["smelt"].parent.parent == pair_dir
    return {
        "JUPYTER_PATH": str(root / "jupyter"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "IPYTHONDIR": str(root / "ipython"),
        "SMELT_CKPT_DIR": str(pair_dir),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(NOTEBOOK_DIR)]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",  # a shared CPU: torch's thread pool stalls tiny ops
        "PLOTLY_RENDERER": "plotly_mimetype",  # figure JSON, without plotly.js in every output
    }


def _snapshot(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_runs_top_to_bottom(
    path: Path, kernel_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from nbclient import NotebookClient

    for key, value in kernel_env.items():
        monkeypatch.setenv(key, value)
    before = _snapshot(NOTEBOOK_DIR)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, on the first error
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.output_type == "error"
    ]
    assert not errors
    assert _snapshot(NOTEBOOK_DIR) == before, "running the notebook wrote into notebooks/"
    # the saved file is untouched (the client executes an in-memory copy)
    saved = nbformat.read(path, as_version=4)
    assert all(c.outputs == [] for c in saved.cells if c.cell_type == "code")


# ---------------------------------------------------------------- notebooks/_setup.py


@pytest.fixture
def setup_module(monkeypatch: pytest.MonkeyPatch):
    """notebooks/_setup.py, imported from its file without writing bytecode into the repo."""
    import importlib.util

    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    spec = importlib.util.spec_from_file_location("_notebook_setup", NOTEBOOK_DIR / "_setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_setup_reads_the_environment_variable(setup_module, tiny_pair, monkeypatch):
    monkeypatch.setenv("SMELT_CKPT_DIR", str(tiny_pair["baseline"].parent.parent))
    assert setup_module.checkpoint_paths(verbose=False) == tiny_pair
    assert setup_module.REPO == REPO


def test_setup_names_a_bad_environment_variable(setup_module, tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_CKPT_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="SMELT_CKPT_DIR=.*must hold baseline/ckpt.pt"):
        setup_module.checkpoint_paths()


def test_setup_without_the_default_pair_explains_and_falls_back(
    setup_module, tiny_pair, tmp_path, monkeypatch, capsys
):
    """No variable and no default pair: say `make train`, use the tiny pair (already trained
    here, so nothing is trained)."""
    monkeypatch.delenv("SMELT_CKPT_DIR", raising=False)
    monkeypatch.setattr(setup_module, "DEFAULT_DIR", str(tmp_path / "untrained"))
    monkeypatch.setattr(setup_module, "TINY_DIR", tiny_pair["baseline"].parent.parent)
    assert setup_module.checkpoint_paths() == tiny_pair
    out = capsys.readouterr().out
    assert "make train" in out and "dyck-pair-tiny" in out
