"""Writing result files safely: atomic writes (a temp file beside the target, flushed and
fsynced, then renamed over it, so an interrupted run never leaves a half-written file and never
loses the previous one), several outputs written all or none (`atomic_write_many`), a check
that a command's outputs can be written and destroy none of its inputs (`check_outputs`, run
before any work), and JSON that strict parsers accept (NaN and infinities as null)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from smelt_interp.errors import ConfigError

PathArg = str | os.PathLike[str]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _remove(temps: Iterable[str]) -> None:
    for tmp in temps:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _write_temp(path: Path, write: Callable[[BinaryIO], None]) -> str:
    """Call `write(fh)` on a new temp file beside `path` (its folder made if missing), flushed,
    fsynced and given the usual permissions; the temp file is removed if anything fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
    except BaseException:
        _remove([tmp])
        raise
    return tmp


def _rename_all(temps: Mapping[Path, str]) -> None:
    """Rename each temp file over its target; on failure, remove the temps not yet renamed."""
    done = 0
    try:
        for path, tmp in temps.items():
            os.replace(tmp, path)
            done += 1
    finally:
        _remove(list(temps.values())[done:])


def atomic_write(path: PathArg, write: Callable[[BinaryIO], None]) -> Path:
    """Call `write(fh)` on a temp file beside `path`, then rename it over `path`."""
    path = Path(path)
    _rename_all({path: _write_temp(path, write)})
    return path


def atomic_write_many(texts: Mapping[PathArg, str]) -> list[Path]:
    """Write every `{path: text}` or none: all temporaries are written and fsynced first, then
    renamed over their targets. A failure before the renames (a folder that cannot be made, a
    full disk) removes the temporaries and leaves every target as it was."""
    temps: dict[Path, str] = {}
    try:
        for target, text in texts.items():
            data = text.encode("utf-8")
            temps[Path(target)] = _write_temp(Path(target), lambda fh, data=data: fh.write(data))
    except BaseException:
        _remove(temps.values())
        raise
    _rename_all(temps)
    return list(temps)


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)  # hard links, bind mounts
    except OSError:
        return False  # one of them does not exist yet


def _writable_place(label: str, path: Path) -> None:
    """An existing folder must not stand where `path` goes, nor a file where a parent goes."""
    if path.is_dir():
        raise ConfigError(f"{label} {path}: is a folder, not a file")
    if path.exists() and not path.is_file():  # a device or FIFO: never rename over one
        raise ConfigError(f"{label} {path}: not a regular file; give a file path")
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{label} {path}: {parent} is a file, not a folder")
            return


def check_outputs(
    inputs: Mapping[str, PathArg | None], outputs: Mapping[str, PathArg | None]
) -> None:
    """Refuse, before any work, outputs that would overwrite an input, two outputs that name
    one file, and outputs that cannot be created (a file where a parent folder belongs).
    Keys are what the user typed (`--json`, `CKPT`), so the one-line message names the clash;
    None values are skipped."""
    ins = {label: Path(p) for label, p in inputs.items() if p is not None}
    outs = {label: Path(p) for label, p in outputs.items() if p is not None}
    for label, out in outs.items():
        _writable_place(label, out)
        for in_label, source in ins.items():
            if _same_file(out, source):
                raise ConfigError(
                    f"{label} {out} is the input {in_label}; refusing to overwrite it"
                )
    seen: dict[Path, str] = {}
    for label, out in outs.items():
        key = out.resolve()
        if key in seen:
            raise ConfigError(f"{seen[key]} and {label} name the same file {out}")
        seen[key] = label


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
