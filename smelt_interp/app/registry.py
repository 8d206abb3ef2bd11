"""The models the dashboard may open: only checkpoints named on its command line, or found
(as ckpt.pt) under folders named there. Each is loaded once at start, so a missing or corrupt
file is a one-line error before anything is served. The default pair (runs/dyck-pair) is
trained first when it is missing or unfinished."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from smelt_interp.atomic import find_files
from smelt_interp.checkpoint import CheckpointInfo, load_checkpoint, read_info
from smelt_interp.config import ModelConfig
from smelt_interp.errors import CheckpointError
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.train.run_folder import CKPT_FILE

DEFAULT_PAIR_DIR = Path("runs") / "dyck-pair"
DEFAULT_PRESET = "dyck-pair"
PAIR = ("baseline", "smelt")


def _name_for(path: Path, root: Path | None) -> str:
    """A model's name: its folder relative to the folder it was found under (e.g. 'smelt',
    'smelt/branch-5000'), or for a file named directly its folder's name."""
    folder = path.parent
    if root is not None and folder != root:
        return folder.relative_to(root).as_posix()
    return folder.name or path.stem


def find_checkpoints(args: Iterable[str | Path]) -> dict[str, Path]:
    """{name: path} for every CKPT argument: a file is taken as is, a folder is searched for
    ckpt.pt files. Raises CheckpointError for a path that does not exist or a folder without
    checkpoints. Names that collide get their parent folder as a prefix."""
    found: list[tuple[str, Path]] = []
    for arg in args:
        path = Path(arg)
        if not path.exists():
            raise CheckpointError(f"{path}: no such checkpoint file or folder")
        if path.is_dir():
            hits = find_files(path, CKPT_FILE)  # any depth: rglob recurses
            if not hits:
                raise CheckpointError(f"{path}: no {CKPT_FILE} found in this folder")
            found += [(_name_for(p, path), p) for p in hits]
        else:
            found.append((_name_for(path, None), path))
    out: dict[str, Path] = {}
    for name, path in found:
        if path.resolve() in {p.resolve() for p in out.values()}:
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
    paths = {arch: root / arch / CKPT_FILE for arch in PAIR}
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
        return (0 if low.startswith("baseline") else 1 if low.startswith("smelt") else 2, i)

    return [name for _, name in sorted(enumerate(names), key=rank)]


class ModelRegistry:
    """Loaded models by name (in display order), with their checkpoint paths and records. A
    model runs one forward pass at a time (`using`): hooks added for one pass would fire in
    any other pass running through the same modules."""

    def __init__(self, paths: dict[str, Path], device: str = "cpu") -> None:
        if not paths:
            raise CheckpointError("no checkpoints to serve")
        self.paths = {name: Path(paths[name]) for name in _order(list(paths))}
        loaded = {name: load_checkpoint(p, device) for name, p in self.paths.items()}
        self.models: dict[str, SmeltModel] = {name: m for name, (m, _) in loaded.items()}
        self.infos = {name: info for name, (_, info) in loaded.items()}
        self.locks = {name: threading.Lock() for name in self.models}

    @classmethod
    def from_models(cls, models: dict[str, SmeltModel]) -> ModelRegistry:
        """A registry of in-memory models (tests, notebooks)."""
        self = cls.__new__(cls)
        self.paths = {name: Path(name) for name in models}
        self.models = {name: models[name].eval() for name in _order(list(models))}
        self.infos = {name: CheckpointInfo(Path(name)) for name in models}
        self.locks = {name: threading.Lock() for name in self.models}
        return self

    @property
    def names(self) -> list[str]:
        return list(self.models)

    @property
    def looped(self) -> list[str]:
        return [n for n, m in self.models.items() if m.cfg.is_looped]

    def get(self, name: str | None) -> SmeltModel:
        if name not in self.models:
            raise KeyError(f"unknown model {name!r}; serving {', '.join(self.models)}")
        return self.models[name]

    @contextmanager
    def using(self, name: str | None) -> Iterator[SmeltModel]:
        """The model `name`, held for this thread alone while the block runs it."""
        model = self.get(name)
        with self.locks[name]:
            yield model

    def cfg(self, name: str) -> ModelConfig:
        return self.get(name).cfg

    def valid(self, name: str | None, prefer_looped: bool = True) -> str:
        """`name` if served, else the default (the first looped model, else the first)."""
        if name in self.models:
            return name
        return (self.looped or self.names)[0] if prefer_looped else self.names[0]

    def pair(self) -> tuple[str, str] | None:
        """(a Baseline's name, a SMELT's name) when both kinds are served."""
        flat = [n for n, m in self.models.items() if not m.cfg.is_looped]
        return (flat[0], self.looped[0]) if flat and self.looped else None

    def info(self, name: str) -> CheckpointInfo:
        """What the model's checkpoint held besides the model (empty for in-memory models)."""
        self.get(name)
        return self.infos[name]
