"""The GPU machine has no package index: what the model, the trainer, the probes and the GPU
check import must come from its image (gpu/device_packages.txt, its documented package
list) or from the wheels carried to it (gpu/wheels.txt, installed there --no-deps).

Checked here without that machine: every third-party package the project's own modules on that
road import (lazy imports included) is one of the two, and so is every requirement of each
carried wheel. The imports themselves, at the machine's versions, run in `make gpu-sim`."""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# What the device scripts (gpu/check_on_device.sh, gpu/lm_pair_on_device.sh) run there and
# what their parts import (every probe too).
ENTRY_MODULES = (
    "smelt_interp.model.transformer",
    "smelt_interp.train.trainer",
    "gpu.check",
    "gpu.lm_pair",
    "smelt_interp.data.__main__",
    "smelt_interp.data.local_text",
    "benchmarks.gpu_train",
    "benchmarks.gpu_shapes",
    "smelt_interp.probes.sink",
)
PROJECT = ("smelt_interp", "benchmarks", "gpu")
# Requirements a carried wheel declares but its modules on this road never import, so the
# machine can do without them: `make gpu-sim` imports transformer_lens (HookedRootModule,
# HookPoint, HookedTransformer) and runs a hooked model there with none of these installed.
UNUSED_REQUIREMENTS = {
    "transformer-lens": {
        "beartype", "fancy-einsum", "transformers-stream-generator", "typeguard", "wandb"
    },
}  # fmt: skip
# Optional loggers that the trainer imports only when a run asks for them (log.wandb); where the
# package is missing, as on the GPU machine, that run is refused in one line naming the extra
# (train.curve_sinks), so the machine can do without it.
OPTIONAL_IMPORTS = {"wandb"}
LOADED = """
import importlib, json, pkgutil, sys
import smelt_interp.probes as probes
for name in sys.argv[1:]:
    importlib.import_module(name)
for info in pkgutil.iter_modules(probes.__path__):
    importlib.import_module(f"smelt_interp.probes.{info.name}")
print(json.dumps(sorted(
    m.__file__ for n, m in list(sys.modules.items())
    if n.split(".")[0] in ("smelt_interp", "benchmarks") and getattr(m, "__file__", None)
)))
"""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _listed(path: Path) -> dict[str, str | None]:
    """Normalised distribution name -> pinned version (None: unpinned) of a requirements file."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[_norm(name)] = version or None
    return out


def _supplied() -> set[str]:
    device = _listed(ROOT / "gpu" / "device_packages.txt")
    return set(device) | set(_listed(ROOT / "gpu" / "wheels.txt"))


def _third_party_imports(files: list[str]) -> set[str]:
    """Top-level names the files import (at any depth of the code), less stdlib and project."""
    names = set()
    for path in files:
        for node in ast.walk(ast.parse(Path(path).read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in PROJECT}


def test_the_projects_imports_come_from_the_device_or_the_carried_wheels() -> None:
    run = subprocess.run(
        [sys.executable, "-c", LOADED, *ENTRY_MODULES],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    files = json.loads(run.stdout.splitlines()[-1])
    assert any(f.endswith("interventions.py") for f in files)  # every probe was imported
    imported = _third_party_imports(files)
    assert {"torch", "transformer_lens", "nnsight", "pandas"} <= imported
    assert OPTIONAL_IMPORTS <= imported  # still imported there: the exemption is still needed
    imported -= OPTIONAL_IMPORTS
    owners = md.packages_distributions()
    supplied = _supplied()
    missing = sorted(n for n in imported if not {_norm(d) for d in owners.get(n, [n])} & supplied)
    assert not missing, f"imported there, but neither on the machine nor carried: {missing}"


def test_each_carried_wheel_finds_its_requirements_there() -> None:
    """The wheels go in --no-deps: what each requires (for Python 3.12 on Linux, no extras)
    must be on the machine or carried too. Read from the wheel's own metadata here, at the
    version it is carried at."""
    supplied = _supplied()
    env = {"python_version": "3.12", "sys_platform": "linux", "platform_system": "Linux"}
    for name, version in _listed(ROOT / "gpu" / "wheels.txt").items():
        dist = md.distribution(name)
        assert dist.version == version, f"{name}: carried {version}, tested here {dist.version}"
        needs = [Requirement(r) for r in dist.requires or ()]
        wanted = {_norm(r.name) for r in needs if r.marker is None or r.marker.evaluate({**env})}
        missing = sorted(wanted - supplied - UNUSED_REQUIREMENTS.get(name, set()))
        assert not missing, f"{name} {version} needs {missing}, neither there nor carried"


def test_the_package_list_is_the_documented_one() -> None:
    """197 names, 30 of them at the versions a session's pip list there gave (torch 2.11.0,
    transformers 5.17.0, ...)."""
    listed = _listed(ROOT / "gpu" / "device_packages.txt")
    pinned = {k: v for k, v in listed.items() if v}
    assert len(listed) == 197 and len(pinned) == 30
    assert pinned["torch"] == "2.11.0" and pinned["transformers"] == "5.17.0"
