"""The device scripts' install step under test: a stand-in wheel (a package of one empty module
that pip installs with no index, so a test can see that the carried wheels went in) and a run
of a script as the device runs it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path


def stand_in_wheel(folder: Path, module: str) -> Path:
    """A wheel of the empty package `module` (version 1.0) in `folder`; returns its path."""
    name = f"{module}-1.0"
    dist = module.replace("_", "-")
    path = folder / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{module}/__init__.py", "")
        wheel.writestr(
            f"{name}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n"
        )
        wheel.writestr(
            f"{name}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr(f"{name}.dist-info/RECORD", "")
    return path


def run_device_script(
    script: Path, tmp: Path, module: str, *args: str
) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """Run a gpu/*_on_device.sh as the device runs it: with a stand-in wheel of `module` in its
    wheel folder, this interpreter as its python3 and a bare PATH. Returns (the finished
    process, the folder the wheels go into, its $OUT)."""
    wheels, site, out = tmp / "wheels", tmp / "site", tmp / "out"
    wheels.mkdir()
    out.mkdir(exist_ok=True)
    stand_in_wheel(wheels, module)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": sys.executable,
        "SMELT_WHEELS": str(wheels),
        "SMELT_SITE": str(site),
        "OUT": str(out),
    }
    run = subprocess.run(
        ["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=300
    )
    return run, site, out
