"""The models the dashboard may open: only checkpoints named on its command line, or found
under folders named there (each ckpt.pt, and each run folder whose checkpoint is still to
come). What exists at start is loaded then, so a corrupt file is a one-line error before
anything is served; a checkpoint that appears or is replaced later is loaded when it does
(ModelRegistry watches each file's stamp). `ensure_default_pair` trains the default pair
(runs/dyck-pair) first when it is missing or unfinished."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from smelt_interp.adapters.inference_loop import loop_label, split_loop_name
from smelt_interp.checkpoint import CheckpointInfo, read_info
from smelt_interp.config import ARCHS, ModelConfig
from smelt_interp.data.bpe import Tokenizer
from smelt_interp.errors import CheckpointError, TokenizerError
from smelt_interp.files import find_files
from smelt_interp.loading import load_model, model_tokenizer
from smelt_interp.model.protocol import LoopedModel, ModelShape
from smelt_interp.provenance import CKPT_FILE, METRICS_FILE
from smelt_interp.train.progress import RunProgress, run_progress
from smelt_interp.train.run_folder import JOB_FILE, LOG_FILE

RUN_MARKS = (METRICS_FILE, JOB_FILE, LOG_FILE)  # files a run writes before its checkpoint
MODEL_FOLDER_MARK = "config.json"  # a transformers model folder (smelt_interp.adapters)
DEFAULT_PAIR_DIR = Path("runs") / "dyck-pair"
DEFAULT_PRESET = "dyck-pair"


def _name_for(path: Path, root: Path | None) -> str:
    """A model's name: its folder relative to the folder it was found under (e.g. 'smelt',
    'smelt/branch-5000'), or for a file named directly its folder's name."""
    folder = path.parent
    if root is not None and folder != root:
        return folder.relative_to(root).as_posix()
    return folder.name or path.stem


def _runs_under(folder: Path) -> list[Path]:
    """The checkpoint path of every run folder under `folder` (itself included): a folder
    with a ckpt.pt, or with a training log or job record whose checkpoint is still to come."""
    # find_files, not rglob: a tree of any depth (rglob recurses past Python's limit)
    return sorted({p.parent for name in (CKPT_FILE, *RUN_MARKS) for p in find_files(folder, name)})


def find_checkpoints(args: Iterable[str | Path]) -> dict[str, Path]:
    """{name: path} for every CKPT argument: a file is taken as is, a transformers model folder
    (one holding config.json) is served as one model under its folder's name, any other folder
    is searched for run folders (their ckpt.pt, which may not exist yet while the run trains).
    Raises
    CheckpointError for a path that does not exist or a folder without runs. Names that
    collide get their parent folder as a prefix."""
    found: list[tuple[str, Path]] = []
    for arg in args:
        path, loop = split_loop_name(arg)
        if not path.exists():
            raise CheckpointError(f"{path}: no such checkpoint file or folder")
        if path.is_dir() and (path / MODEL_FOLDER_MARK).is_file():  # served as FOLDER@SPAN
            found.append((loop_label(path.resolve().name, loop), Path(str(arg))))
        elif loop is not None:
            raise CheckpointError(f"{arg}: a loop at inference needs a transformers model folder")
        elif path.is_dir():
            hits = [run / CKPT_FILE for run in _runs_under(path)]
            if not hits:
                raise CheckpointError(f"{path}: no {CKPT_FILE} found in this folder")
            found += [(_name_for(p, path), p) for p in hits]
        else:
            found.append((_name_for(path, None), path))
    out: dict[str, Path] = {}
    for name, path in found:
        if str(path.resolve()) in {str(p.resolve()) for p in out.values()}:
            continue
        if name in out:
            name = f"{path.parent.parent.name}/{name}"
        n, base = 2, name
        while name in out:
            name, n = f"{base}-{n}", n + 1
        out[name] = path
    return out


def _finished(path: Path) -> bool:
    if not path.exists():
        return False
    try:
        return read_info(path).final
    except CheckpointError:
        return False


def ensure_default_pair(
    root: str | Path = DEFAULT_PAIR_DIR, preset: str = DEFAULT_PRESET, progress: bool = True
) -> dict[str, Path]:
    """{baseline, smelt} checkpoints under `root`, training the preset's pair first (resuming a
    partial run, with the trainer's progress bars) when either is missing or unfinished."""
    root = Path(root)
    paths = {arch: root / arch / CKPT_FILE for arch in ARCHS}
    missing = [arch for arch, p in paths.items() if not _finished(p)]
    if missing:
        from smelt_interp.train.config import TrainConfig
        from smelt_interp.train.presets import get_preset
        from smelt_interp.train.trainer import train_pair

        print(
            f"training the default pair ({preset}: {', '.join(missing)}) into {root}; "
            f"this runs once, progress below",
            flush=True,
        )
        train_pair(
            TrainConfig.from_dict(get_preset(preset)),
            root,
            archs=missing,
            resume=True,
            progress=progress,
        )
    return paths


def _order(names: Sequence[str]) -> list[str]:
    """Baseline-like names first, then SMELT-like, then the rest in their given order."""

    def rank(item: tuple[int, str]) -> tuple[int, int]:
        i, name = item
        low = name.lower()
        kind = next((k for k, arch in enumerate(ARCHS) if low.startswith(arch)), len(ARCHS))
        return (kind, i)

    return [name for _, name in sorted(enumerate(names), key=rank)]


@dataclass(frozen=True)
class Loaded:
    """One checkpoint as loaded: the model, the rest of the file's record, the file's stamp
    when it was read and a version that counts the loads of this name (part of cache keys)."""

    model: LoopedModel
    info: CheckpointInfo
    stamp: tuple[int, int, int] | None
    version: int


def on_disk(path: Path) -> Path:
    """The file or folder a served path reads: a model folder's own, for FOLDER@SPAN."""
    return split_loop_name(path)[0]


def stamp_of(path: Path) -> tuple[int, int, int] | None:
    """(inode, mtime in ns, size) of a file, None when it is not there: an atomic replace
    (a resumed run's new checkpoint) changes it."""
    try:
        st = on_disk(path).stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class ModelRegistry:
    """Models by name (in display order), with their checkpoint paths and records. A model
    runs one forward pass at a time (`using`): hooks added for one pass would fire in any
    other pass running through the same modules.

    A name whose checkpoint does not exist yet, in a run folder (a run still training or
    queued), is pending: it is not among `names` and `pending()` gives its run's progress.
    Every look at the models checks each file's stamp, so a checkpoint that appears is loaded
    and one replaced while the app runs (a resumed run) is reloaded, not served stale; a file
    that cannot be read yet keeps what was served before until its stamp changes again. One
    thread loads a given name at a time; the others wait for it."""

    def __init__(
        self,
        paths: dict[str, Path],
        device: str = "cpu",
        allow_remote_code: bool = False,
        jobs: dict[str, Path] | None = None,
    ) -> None:
        if not paths:
            raise CheckpointError("no checkpoints to serve")
        self.paths = {name: Path(paths[name]) for name in _order(list(paths))}
        self.device = device
        self.allow_remote_code = allow_remote_code  # a model folder may run its own code
        # where a pending model's job keeps its record, when not in its own folder (the real
        # model's preparation: app.jobs.REAL_LM_RUN); by default a run folder's own
        self.jobs = {name: Path(p) for name, p in (jobs or {}).items()}
        self._loaded: dict[str, Loaded] = {}
        self._tried: dict[str, tuple[int, int, int] | None] = {}  # stamps that failed to load
        self._loading = {name: threading.Lock() for name in self.paths}
        self.locks = {name: threading.Lock() for name in self.paths}
        for name, path in self.paths.items():
            if on_disk(path).exists():
                self._load(name, stamp_of(path), strict=True)  # a bad file: one line at start
            elif run_progress(self.run_of(name)).state in ("missing", "not_a_run"):
                raise CheckpointError(f"{path}: no such checkpoint, and no run writing it")

    @classmethod
    def from_models(cls, models: dict[str, LoopedModel]) -> ModelRegistry:
        """A registry of in-memory models (tests, notebooks)."""
        self = cls.__new__(cls)
        self.paths = {name: Path(name) for name in _order(list(models))}
        self.device, self.allow_remote_code = "cpu", False
        self._loaded = {
            name: Loaded(models[name].eval(), CheckpointInfo(Path(name)), None, 0)
            for name in self.paths
        }
        self._tried, self.jobs = {}, {}
        self._loading = {name: threading.Lock() for name in self.paths}
        self.locks = {name: threading.Lock() for name in self.paths}
        return self

    # ----- watching the files -------------------------------------------------------------
    def _load(self, name: str, stamp: tuple[int, int, int] | None, strict: bool = False) -> None:
        try:
            model, info = load_model(self.paths[name], self.device, self.allow_remote_code)
        except CheckpointError:
            if strict:
                raise
            self._tried[name] = stamp  # half-written or corrupt: wait for the next change
            return
        old = self._loaded.get(name)
        self._loaded[name] = Loaded(model, info, stamp, old.version + 1 if old else 1)
        self._tried.pop(name, None)

    def refresh(self, name: str) -> None:
        """Load `name` when its file appeared or changed since it was read."""
        old = self._loaded.get(name)
        if old is not None and old.stamp is None:
            return  # in memory: nothing to watch
        stamp = stamp_of(self.paths[name])
        if stamp is None or (old is not None and old.stamp == stamp):
            return
        if self._tried.get(name, ()) == stamp:
            return
        with self._loading[name]:
            current = self._loaded.get(name)
            if (current is None or current.stamp != stamp) and self._tried.get(name, ()) != stamp:
                self._load(name, stamp)

    def _entries(self) -> dict[str, Loaded]:
        for name in self.paths:
            self.refresh(name)
        return {name: self._loaded[name] for name in self.paths if name in self._loaded}

    def pending(self) -> list[tuple[str, RunProgress]]:
        """(name, its run's progress) for every name whose checkpoint is not loaded yet."""
        loaded = self._entries()
        waiting = [name for name in self.paths if name not in loaded]
        return [(name, run_progress(self.run_of(name))) for name in waiting]

    def run_of(self, name: str) -> Path:
        """The folder whose job record says how `name`'s model is coming along."""
        return self.jobs.get(name, self.paths[name].parent)

    # ----- the loaded models --------------------------------------------------------------
    @property
    def models(self) -> dict[str, LoopedModel]:
        return {name: entry.model for name, entry in self._entries().items()}

    @property
    def names(self) -> list[str]:
        return list(self._entries())

    @property
    def looped(self) -> list[str]:
        return [n for n, m in self.models.items() if m.cfg.is_looped]

    def entry(self, name: str | None) -> Loaded:
        """The current load of `name` (reloaded first when its file changed)."""
        if name in self.paths:
            self.refresh(name)
        if name not in self._loaded:
            served = ", ".join(self._loaded) or "none yet"
            raise KeyError(f"unknown model {name!r}; serving {served}")
        return self._loaded[name]

    def get(self, name: str | None) -> LoopedModel:
        return self.entry(name).model

    def version(self, name: str) -> int:
        """How many times `name` has been loaded: a cache key part that changes on reload."""
        return self.entry(name).version

    @contextmanager
    def using(self, name: str | None) -> Iterator[LoopedModel]:
        """The model `name`, held for this thread alone while the block runs it."""
        model = self.get(name)
        with self.locks[name]:
            yield model

    def cfg(self, name: str) -> ModelShape:
        return self.get(name).cfg

    def valid(self, name: str | None, prefer_looped: bool = True) -> str:
        """`name` if served, else the default (the first looped model, else the first)."""
        names = self.names
        if name in names:
            return name
        return (self.looped or names)[0] if prefer_looped else names[0]

    def pair(self) -> tuple[str, str] | None:
        """(a Baseline's name, a SMELT's name) when both kinds are served (this project's
        configs only: an adapted transformers model has no budget to match)."""
        models = {n: m for n, m in self.models.items() if isinstance(m.cfg, ModelConfig)}
        flat = [n for n, m in models.items() if not m.cfg.is_looped]
        looped = [n for n, m in models.items() if m.cfg.is_looped]
        return (flat[0], looped[0]) if flat and looped else None

    def tokenizer(self, name: str | None) -> Tokenizer:
        """The tokenizer the checkpoint carries (the byte tokenizer when it names none), or a
        model folder's own; a record that does not match its hash is one CheckpointError
        line."""
        entry = self.entry(name)
        try:
            return model_tokenizer(entry.info)
        except TokenizerError as exc:
            raise CheckpointError(f"{entry.info.path}: {exc}") from None

    def info(self, name: str) -> CheckpointInfo:
        """What the model's checkpoint held besides the model (empty for in-memory models)."""
        return self.entry(name).info
