"""Files in and out, safely.

Reading: every file input is checked before it is read (`open_input`: opened without blocking,
so a FIFO never hangs, and refused unless it is a regular file within its size cap) and read in
bounded memory (`read_input_bytes`, `read_input_text`); JSON from a user is parsed within bounds
(`parse_json`: no RecursionError from deep nesting, no ValueError from a huge integer).

Writing: atomic writes (a temp file beside the target, flushed and fsynced, then renamed over
it, so an interrupted run never leaves a half-written file and never loses the previous one),
several outputs written all or none (`atomic_write_many`), a check that a command's outputs can
be written and destroy none of its inputs (`check_outputs`, run before any work), and JSON that
strict parsers accept (NaN and infinities as null). A full disk is one line (`DiskFullError`)."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from smelt_interp.errors import ConfigError, SmeltError

PathArg = str | os.PathLike[str]
MAX_JSON_DEPTH = 64  # nesting of a config, a --set value or a JSONL line: real ones use 3


# ----- reading ----------------------------------------------------------------------------------
def open_input(
    path: PathArg,
    max_bytes: int,
    error: type[SmeltError] = ConfigError,
    what: str = "file",
    *,
    follow_links: bool = True,
) -> BinaryIO:
    """`path` opened for reading, once it is known to be a regular file of at most `max_bytes`.
    It is opened with O_NONBLOCK (a FIFO opens at once instead of waiting for a writer) and
    checked on the open descriptor, so nothing can swap it between the check and the read. A
    missing file, a folder, a device, a FIFO, a socket or a file past the cap is `error`; so is
    a symbolic link when `follow_links` is False (O_NOFOLLOW: a link swapped in after a check of
    where it points is refused too)."""
    path = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise error(f"{path}: no such {what} (No such file or directory)") from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise error(f"{path}: is a folder, not a {what}")
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{path}: not a regular file (a device, FIFO or socket is not read)")
        if info.st_size > max_bytes:
            raise error(f"{path}: larger than {_size(max_bytes)}, the most read from one {what}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input_bytes(
    path: PathArg,
    max_bytes: int,
    error: type[SmeltError] = ConfigError,
    what: str = "file",
    *,
    follow_links: bool = True,
) -> bytes:
    """The bytes of `path` (see open_input), never more than `max_bytes` read (a file that grows
    while it is read is refused too)."""
    with open_input(path, max_bytes, error, what, follow_links=follow_links) as fh:
        try:
            raw = fh.read(max_bytes + 1)
        except OSError as exc:
            raise error(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > max_bytes:
        raise error(f"{path}: larger than {_size(max_bytes)}, the most read from one {what}")
    return raw


def _size(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n:,} bytes"


def read_input_text(
    path: PathArg, max_bytes: int, error: type[SmeltError] = ConfigError, what: str = "file"
) -> str:
    """The UTF-8 text of `path` (see read_input_bytes); other bytes are `error`."""
    raw = read_input_bytes(path, max_bytes, error, what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None


def find_files(root: PathArg, name: str) -> list[Path]:
    """Every file called `name` under the folder `root`, sorted; found with an explicit stack,
    so a tree of any depth (Path.rglob recurses, and fails past ~1,000 levels) is searched.
    Links to folders are not followed (a link loop would never end); unreadable folders are
    skipped."""
    found, stack = [], [Path(root)]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    elif entry.name == name:
                        found.append(Path(entry.path))
        except OSError:
            continue
    return sorted(found)


def json_depth(value: Any) -> int:
    """How deep lists and dicts nest in `value` (a scalar is 0), found without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_json(
    text: str, where: str, error: type[SmeltError] = ConfigError, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """`json.loads(text)`, but a value the parser cannot hold (nested so deep it recurses
    without bound, an integer past Python's digit limit) or nested more than `max_depth` deep
    (later code walks it) is `error` naming `where`; invalid JSON is json.JSONDecodeError."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise
    except (RecursionError, ValueError) as exc:
        reason = (
            "nests too deep to parse"
            if isinstance(exc, RecursionError)
            else f"holds a number too long to parse ({' '.join(str(exc).split())[:80]})"
        )
        raise error(f"{where}: the JSON value {reason}; refused") from None
    if json_depth(value) > max_depth:
        raise error(f"{where}: JSON nested more than {max_depth} deep; refused")
    return value


def read_json_input(
    path: PathArg,
    max_bytes: int,
    error: type[SmeltError] = ConfigError,
    what: str = "file",
    *,
    missing_ok: bool = False,
) -> Any:
    """The JSON value of the file `path`, read as an input (read_input_text's checks) and
    parsed within bounds (parse_json); invalid JSON is `error` too, in one line. With
    `missing_ok`, None where nothing is at `path`."""
    if missing_ok and not os.path.lexists(path):
        return None
    text = read_input_text(path, max_bytes, error, what)
    try:
        return parse_json(text, str(path), error)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None


# ----- writing ----------------------------------------------------------------------------------
class DiskFullError(SmeltError, OSError):
    """A write that found no space left on its device; the file it would replace is kept."""


def _write_failed(path: Path, exc: OSError) -> OSError:
    """A full disk or quota as one line naming the file; any other OSError as it was."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(
            f"{path}: no space left on its device while writing it; the previous file is kept, "
            f"free some space and run again"
        )
    return exc


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
    except OSError as exc:
        _remove([tmp])
        raise _write_failed(path, exc) from None
    except RuntimeError as exc:  # torch.save's zip writer wraps the OSError in a RuntimeError
        _remove([tmp])
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, OSError) or _says_disk_full(exc):
            full = cause if isinstance(cause, OSError) else OSError(errno.ENOSPC, "disk full")
            raise _write_failed(path, full) from None
        raise
    except BaseException:
        _remove([tmp])
        raise
    return tmp


def _says_disk_full(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "no space left" in text or "file write failed" in text


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


def _inside(path: Path, folder: Path) -> bool:
    """Whether `path` lies in the existing folder `folder` (a file a folder input reads)."""
    if not folder.is_dir():
        return False
    return path.resolve().is_relative_to(folder.resolve())


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
    """Refuse, before any work, outputs that would overwrite an input (or a file inside an input
    folder), two outputs that name one file, and outputs that cannot be created (a file where a
    parent folder belongs).
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
            if _inside(out, source):
                raise ConfigError(
                    f"{label} {out} is inside the input folder {in_label}; refusing to write "
                    f"into what it reads"
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
