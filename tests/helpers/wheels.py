"""A stand-in wheel for the device scripts' install step: a package of one empty module that
pip installs with no index, so a test can see that the carried wheels went in."""

from __future__ import annotations

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
