"""Writing result files safely: atomic writes (a temp file beside the target, flushed and
fsynced, then renamed over it, so an interrupted run never leaves a half-written file and never
loses the previous one), and JSON that strict parsers accept (NaN and infinities as null)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], None]) -> Path:
    """Call `write(fh)` on a temp file beside `path`, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> Path:
    import torch  # here, so text-only users (the scaling CLI) start without torch

    return atomic_write(path, lambda fh: torch.save(obj, fh))


def json_safe(obj: Any) -> Any:
    """`obj` with every non-finite float replaced by None, recursively (dict keys as strings)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def json_text(obj: Any, indent: int | None = 1) -> str:
    """Strict JSON (no NaN), pretty-printed; objects json cannot encode are written as str()."""
    return json.dumps(json_safe(obj), indent=indent, default=str, allow_nan=False)
