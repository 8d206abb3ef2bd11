"""The text this machine holds, as a corpus (`python -m smelt_interp.data gather`).

A machine that reaches nothing outside it still holds text: the Python source of the standard
library and the installed packages (domain `python`), their docs and /usr/share/doc (`docs`),
C/C++/CUDA headers (`headers`). `gather` walks those roots (or explicit DOMAIN=PATH ones) in
sorted order, reads the files with a process pool, keeps each strict-UTF-8, NUL-free text of
MIN_FILE_BYTES to MAX_FILE_BYTES once (exact duplicates by BLAKE2b, across domains, the first
read kept) and stages it as `OUT/DOMAIN/part-NNNNN.jsonl`, lines `{"text", "domain", "id"}`,
which `prepare` reads (GatherStats.sources() names the folders). So the corpus holds each
document once and its token count is its count of unique tokens.

The byte budget is shared fairly: each domain gets an equal share and what a domain cannot fill
goes to the others (water-filling, in rounds), so a huge site-packages cannot crowd out the
headers. A domain stops at the first document that would pass its share, so the total never
passes the budget, and what is kept depends only on the files, not on the number of workers.

`OUT/gather.json` is written last: a non-empty OUT without it (an interrupted gather) is
refused; one with it, for the same roots and budget, is returned as it is."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import multiprocessing
import os
import site
import stat
import sys
import sysconfig
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from smelt_interp.data.user_files import MAX_FILE_BYTES
from smelt_interp.errors import DataError
from smelt_interp.files import atomic_write_text, json_text, open_input, read_input_bytes
from smelt_interp.files import read_json_input as read_json  # a FIFO or deep JSON: one line

PYTHON_SUFFIXES = (".py",)
DOCS_SUFFIXES = (".md", ".rst", ".txt")
HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".cuh", ".inl")
EVERY_FILE = "*"  # in a suffix list: every regular file; "" is a name with no suffix
DOMAIN_SUFFIXES = {
    "python": PYTHON_SUFFIXES,
    "docs": (*DOCS_SUFFIXES, "", ".gz"),  # an explicit docs root: README, NEWS.gz too
    "headers": HEADER_SUFFIXES,
}
TEXT_SUFFIXES = PYTHON_SUFFIXES + DOCS_SUFFIXES + HEADER_SUFFIXES  # an explicit other domain
SYSTEM_DOCS = Path("/usr/share/doc")
SYSTEM_HEADERS = (Path("/usr/include"), Path("/usr/local/include"), Path("/usr/local/cuda/include"))
MIN_FILE_BYTES = 64
DEFAULT_MAX_BYTES = 1 << 30
PART_BYTES = 64 << 20  # a JSONL part file rolls over past this
GATHER_FILE = "gather.json"
GATHER_VERSION = 1
SKIP_REASONS = ("too_small", "too_large", "not_utf8", "binary", "duplicate", "unreadable")
FIRST_WINDOW, MAX_WINDOW = 64, 4096  # files read ahead at once; a window doubles up to MAX
WINDOW_BYTES = 64 << 20

_Task = tuple[str, str, str, int]  # path, document id, domain, size on disk
_Read = tuple[str | None, bytes, bytes, int]  # skip reason, JSONL line, digest, text bytes


@dataclass(frozen=True)
class Root:
    """A folder (or file) to read, the domain its files go to and the suffixes taken from it."""

    domain: str
    path: Path
    suffixes: tuple[str, ...]

    def takes(self, name: str) -> bool:
        suffix = Path(name).suffix.lower()
        return EVERY_FILE in self.suffixes or suffix in self.suffixes

    def record(self) -> dict[str, Any]:
        return {"domain": self.domain, "path": str(self.path), "suffixes": list(self.suffixes)}


def package_roots() -> list[Path]:
    """The standard library and every site-packages / dist-packages folder of this Python."""
    paths = sysconfig.get_paths()
    found = [paths["stdlib"], paths["purelib"], paths["platlib"], *site.getsitepackages()]
    found += [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    return [Path(p) for p in found if p]


def default_roots() -> list[Root]:
    """Every default root, existing or not (gather uses the folders that exist)."""
    packages, paths = package_roots(), sysconfig.get_paths()
    headers = [*SYSTEM_HEADERS, Path(paths["include"]), Path(paths["platinclude"]), *packages]
    return [
        *(Root("python", p, PYTHON_SUFFIXES) for p in packages),
        *(Root("docs", p, DOCS_SUFFIXES) for p in packages),
        Root("docs", SYSTEM_DOCS, (EVERY_FILE,)),
        *(Root("headers", p, HEADER_SUFFIXES) for p in headers),
    ]


def explicit_roots(specs: Sequence[str]) -> list[Root]:
    """DOMAIN=PATH roots (prepare's Source syntax): the suffixes of that domain, or for any
    other domain every text suffix of the three."""
    from smelt_interp.data.prepare import Source  # here: pool workers import this module

    out = []
    for spec in specs:
        source = Source.parse(spec)
        out.append(
            Root(source.domain, source.path, DOMAIN_SUFFIXES.get(source.domain, TEXT_SUFFIXES))
        )
    return out


def usable_roots(roots: Iterable[Root]) -> list[Root]:
    """The roots that exist, resolved, by domain and path, less any root that is the same as
    or inside another root of its domain (its files would be read twice)."""
    kept: list[Root] = []
    resolved = sorted(
        {(r.domain, r.path.resolve(), r.suffixes) for r in roots if r.path.exists()},
        key=lambda r: (r[0], str(r[1]), r[2]),
    )
    for domain, path, suffixes in resolved:
        if not any(k.domain == domain and (k.path == path or k.path in path.parents) for k in kept):
            kept.append(Root(domain, path, suffixes))
    return kept


def _tags(roots: Sequence[Root]) -> dict[Path, str]:
    """Each root's id prefix: the shortest tail of its path that no other root's path ends in
    (`site-packages`, `lib/python3.11` beside `include/python3.11`)."""
    paths = {r.path: r.path.parts[1:] for r in roots}
    tags = {}
    for path, parts in paths.items():
        n = 1
        while n < len(parts) and any(o != path and q[-n:] == parts[-n:] for o, q in paths.items()):
            n += 1
        tags[path] = "/".join(parts[-n:]) or "root"
    return tags


def _decodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes (surrogate escapes): no JSON id spells it
        return False
    return True


def _walk(
    top: Path, pick: Callable[[str], str | None], seen: set[tuple[int, int]]
) -> Iterator[tuple[str, str, str, int]]:
    """(domain, path, relative path, size) of each regular file under `top` that `pick` gives
    a domain, in os.walk's sorted order (a folder's files, then its subfolders). Hidden names
    and __pycache__ are skipped, links to folders are not followed, unreadable folders are
    skipped; a file in `seen` (by device and inode: a link to a file read before, a hard link)
    is skipped too."""
    if not top.is_dir():  # a file root
        info, domain = top.stat(), pick(top.name)
        if domain is not None and stat.S_ISREG(info.st_mode):
            seen.add((info.st_dev, info.st_ino))
            yield domain, str(top), "", info.st_size
        return
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(top / rel) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        folders = []
        for entry in entries:
            if entry.name.startswith(".") or not _decodable(entry.name):
                continue
            sub = f"{rel}/{entry.name}" if rel else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        folders.append(sub)
                    continue
                domain = pick(entry.name)
                info = entry.stat() if domain is not None else None
            except OSError:  # a dangling link, a file gone meanwhile
                continue
            if info is None or not stat.S_ISREG(info.st_mode):
                continue
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                yield domain, entry.path, sub, info.st_size
        stack.extend(reversed(folders))


def list_files(roots: Sequence[Root]) -> dict[str, list[_Task]]:
    """Each domain's files in order: its roots by path, each walked once for all domains (a file
    a root of two domains takes goes to the first domain by name)."""
    tags = _tags(roots)
    seen: set[tuple[int, int]] = set()
    tasks: dict[str, list[_Task]] = {r.domain: [] for r in roots}
    for path in sorted({r.path for r in roots}, key=str):
        here = sorted((r for r in roots if r.path == path), key=lambda r: r.domain)

        def pick(name: str, here: list[Root] = here) -> str | None:
            return next((r.domain for r in here if r.takes(name)), None)

        for domain, file, rel, size in _walk(path, pick, seen):
            doc_id = f"{tags[path]}/{rel}" if rel else tags[path]
            tasks[domain].append((file, doc_id, domain, size))
    return tasks


def _read_raw(path: str) -> bytes:
    if not path.endswith(".gz"):
        return read_input_bytes(path, MAX_FILE_BYTES, DataError, "text file")
    with open_input(path, MAX_FILE_BYTES, DataError) as fh, gzip.GzipFile(fileobj=fh) as unzipped:
        return unzipped.read(MAX_FILE_BYTES + 1)  # a gzip bomb stops here


def read_file(task: _Task) -> _Read:
    """(skip reason or None, JSONL line, BLAKE2b digest, text bytes) of one file (gzip
    decompressed); runs in a pool worker."""
    path, doc_id, domain, size = task
    if size > MAX_FILE_BYTES:
        return "too_large", b"", b"", 0
    if size < MIN_FILE_BYTES and not path.endswith(".gz"):
        return "too_small", b"", b"", 0
    try:
        raw = _read_raw(path)
    except (DataError, OSError, EOFError, zlib.error):
        return "unreadable", b"", b"", 0
    if len(raw) < MIN_FILE_BYTES or len(raw) > MAX_FILE_BYTES:
        return ("too_small" if len(raw) < MIN_FILE_BYTES else "too_large"), b"", b"", 0
    if b"\0" in raw:
        return "binary", b"", b"", 0
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "not_utf8", b"", b"", 0
    record = {"text": text, "domain": domain, "id": doc_id}
    line = json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n"
    return None, line, hashlib.blake2b(raw, digest_size=16).digest(), len(raw)


class _Cursor:
    """A domain's files, read ahead by the pool in growing windows and taken in order."""

    def __init__(self, tasks: list[_Task], read_many: Callable[[list[_Task]], Iterator[_Read]]):
        self.tasks, self.read_many = tasks, read_many
        self.pos, self.window = 0, FIRST_WINDOW
        self.head: _Read | None = None
        self.pending: Iterator[_Read] = iter(())

    def peek(self) -> _Read | None:
        """The next file's result, or None when every file is taken."""
        if self.head is None:
            self.head = next(self.pending, None)
        if self.head is None and self.pos < len(self.tasks):
            end, size = self.pos, 0
            while end < len(self.tasks) and end - self.pos < self.window and size < WINDOW_BYTES:
                size += self.tasks[end][3]
                end += 1
            self.pending = self.read_many(self.tasks[self.pos : end])
            self.pos, self.window = end, min(2 * self.window, MAX_WINDOW)
            self.head = next(self.pending)
        return self.head

    def pop(self) -> None:
        self.head = None


class _Parts:
    """A domain's JSONL part files: created when first written, rolled past PART_BYTES."""

    def __init__(self, folder: Path):
        self.folder, self.names, self.size = folder, [], 0
        self.fh: Any = None

    def write(self, line: bytes) -> None:
        if self.fh is None or self.size + len(line) > PART_BYTES:
            self.close()
            self.folder.mkdir(exist_ok=True)
            self.names.append(f"part-{len(self.names):05d}.jsonl")
            self.fh, self.size = open(self.folder / self.names[-1], "wb"), 0
        self.fh.write(line)
        self.size += len(line)

    def close(self) -> None:
        if self.fh is not None:
            self.fh.flush()
            os.fsync(self.fh.fileno())  # on disk before gather.json says it is
            self.fh.close()
            self.fh = None

    def remove(self) -> None:
        self.close()
        for name in self.names:
            (self.folder / name).unlink(missing_ok=True)
        if self.folder.is_dir() and not any(self.folder.iterdir()):
            self.folder.rmdir()


@dataclass
class DomainStats:
    """What one domain gave: kept documents and their bytes, files listed, skips by reason."""

    documents: int = 0
    bytes: int = 0
    files: int = 0
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SKIP_REASONS, 0))
    roots: list[str] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    budget_reached: bool = False
    seconds: float = 0.0


@dataclass
class GatherStats:
    """A finished gather (what gather.json holds); `reused`: found whole in OUT, not redone."""

    out: Path
    max_bytes: int
    roots: list[dict[str, Any]]
    domains: dict[str, DomainStats]
    seconds: float = 0.0
    reused: bool = False

    @property
    def documents(self) -> int:
        return sum(d.documents for d in self.domains.values())

    @property
    def bytes(self) -> int:
        return sum(d.bytes for d in self.domains.values())

    def sources(self) -> list[str]:
        """prepare's DOMAIN=PATH specs of the staged domains that hold documents."""
        return [f"{d}={self.out / d}" for d in sorted(self.domains) if self.domains[d].documents]

    def record(self) -> dict[str, Any]:
        domains = {d: asdict(s) for d, s in sorted(self.domains.items())}
        return {
            "version": GATHER_VERSION,
            "complete": True,
            "max_bytes": self.max_bytes,
            "roots": self.roots,
            "documents": self.documents,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "domains": domains,
        }

    @classmethod
    def read(cls, out: Path) -> GatherStats | None:
        """The finished gather in `out`, or None when it holds none (or a damaged one)."""
        data = read_json(out / GATHER_FILE, 1 << 24, DataError, "gather record", missing_ok=True)
        try:  # a record that is not an object is damaged (AttributeError): none
            if data.get("version") != GATHER_VERSION or data.get("complete") is not True:
                return None
            domains = {d: DomainStats(**s) for d, s in data["domains"].items()}
            stats = cls(out, data["max_bytes"], data["roots"], domains, data["seconds"], True)
        except (OSError, UnicodeDecodeError, ValueError, AttributeError, KeyError, TypeError):
            return None  # json.JSONDecodeError is a ValueError
        whole = all((out / d / p).is_file() for d, s in domains.items() for p in s.parts)
        return stats if whole else None


def _nothing(looked: Sequence[Path]) -> DataError:
    where = ", ".join(dict.fromkeys(str(p) for p in looked)) or "no roots"
    return DataError(f"no text found on this machine (looked under {where}): nothing to gather")


def _check_out(out: Path, roots: Sequence[Root], max_bytes: int) -> GatherStats | None:
    """The finished gather `out` already holds for these roots and budget, else None for an
    absent or empty `out`; any other `out` is refused."""
    target = out.resolve()
    for r in roots:
        if target == r.path or r.path in target.parents or target in r.path.parents:
            raise DataError(f"--out {out} lies inside the root {r.path} (or holds it)")
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out}: a file, not a folder")
    if not out.exists() or not any(out.iterdir()):
        return None
    done = GatherStats.read(out)
    if done is None:
        raise DataError(
            f"--out {out}: not empty and not a finished gather (an interrupted one has no "
            f"{GATHER_FILE}); remove it or choose a new folder"
        )
    if done.roots != [r.record() for r in roots] or done.max_bytes != max_bytes:
        raise DataError(
            f"--out {out}: holds a gather of other roots or budget; choose a new folder"
        )
    return done


def _fill(
    cursors: dict[str, _Cursor],
    parts: dict[str, _Parts],
    stats: dict[str, DomainStats],
    max_bytes: int,
    progress: Callable[[int], None],
) -> None:
    """Read each domain up to an equal share of what the exhausted domains left, in rounds,
    until no domain runs out (every other one has reached its share) or all have."""
    seen: set[bytes] = set()
    exhausted: set[str] = set()
    while len(exhausted) < len(cursors):
        active = [d for d in sorted(cursors) if d not in exhausted]
        share = (max_bytes - sum(stats[d].bytes for d in exhausted)) // len(active)
        for domain in active:
            start, s, cursor = time.perf_counter(), stats[domain], cursors[domain]
            while (got := cursor.peek()) is not None:
                reason, line, digest, n = got
                if reason is None and digest in seen:
                    reason = "duplicate"
                if reason is None and s.bytes + n > share:
                    break
                cursor.pop()
                if reason is not None:
                    s.skipped[reason] += 1
                    continue
                seen.add(digest)
                parts[domain].write(line)
                s.documents, s.bytes = s.documents + 1, s.bytes + n
                progress(n)
            s.budget_reached = got is not None
            if got is None:
                exhausted.add(domain)
            s.seconds += time.perf_counter() - start
        if all(stats[d].budget_reached for d in active):
            break


def gather(
    out: str | os.PathLike[str],
    roots: Sequence[str] | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> GatherStats:
    """Stage the text under `roots` (DOMAIN=PATH specs; None: default_roots()) in the folder
    `out`, at most `max_bytes` of text, read by `workers` processes (None: every core); see
    the module docstring; `progress(bytes)` is called after each document kept. An `out`
    holding this gather already is returned as it is."""
    start = time.perf_counter()
    if max_bytes < 1:
        raise DataError(f"max_bytes must be >= 1, got {max_bytes}")
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise DataError(f"workers must be >= 1, got {workers}")
    wanted = default_roots() if roots is None else explicit_roots(roots)
    plan = usable_roots(wanted)
    if not plan:
        raise _nothing([r.path for r in wanted])
    out = Path(out)
    done = _check_out(out, plan, max_bytes)
    if done is not None:
        return done
    tasks = list_files(plan)
    if not any(tasks.values()):
        raise _nothing([r.path for r in plan])
    stats = {
        d: DomainStats(files=len(t), roots=[str(r.path) for r in plan if r.domain == d])
        for d, t in tasks.items()
    }
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    parts = {d: _Parts(out / d) for d in tasks}
    try:
        with contextlib.ExitStack() as stack:
            read_many: Callable[[list[_Task]], Iterator[_Read]] = lambda w: map(read_file, w)
            if workers > 1:  # spawned, not forked: this process may run threads (torch)
                pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(workers))
                # map, not imap: each window is read whole, so no task is left in flight when
                # the pool is terminated (a terminate() with tasks queued can hang)
                read_many = lambda w: iter(
                    pool.map(read_file, w, chunksize=max(1, min(64, len(w) // (4 * workers))))
                )
            cursors = {d: _Cursor(t, read_many) for d, t in tasks.items()}
            _fill(cursors, parts, stats, max_bytes, progress or (lambda n: None))
        for d, p in parts.items():
            p.close()
            stats[d].parts = list(p.names)
        if not any(s.documents for s in stats.values()):
            raise _nothing([r.path for r in plan])
    except BaseException:
        for p in parts.values():
            p.remove()
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise
    result = GatherStats(out, max_bytes, [r.record() for r in plan], stats)
    result.seconds = time.perf_counter() - start
    atomic_write_text(out / GATHER_FILE, json_text(result.record()))
    return result
