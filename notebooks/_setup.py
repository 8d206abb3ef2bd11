"""The first cell of every notebook: make `smelt_interp` importable from a checkout and find the
Baseline/SMELT checkpoint pair.

The pair is read from $SMELT_CKPT_DIR (absolute, or relative to the repository root; default
`runs/dyck-pair`, which `make train` writes) as `<dir>/baseline/ckpt.pt` and `<dir>/smelt/ckpt.pt`.
If the variable is unset and the default pair has not been trained, the notebooks say how to train
it and meanwhile use the seconds-long preset `dyck-pair-tiny`, trained once into a temp folder
(good for trying the code, not for reading the numbers).

`load_tokenizers` gives each model's own tokenizer (BPE when its checkpoint carries one, else
bytes): the notebooks encode prompts and label tokens with it, never with a tokenizer of their
own choosing."""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # a checkout without `make install`
    sys.path.insert(0, str(REPO))

# tqdm.auto (the probes' progress bars) warns in a kernel without ipywidgets; the bars still work
warnings.filterwarnings("ignore", message="IProgress not found")

ENV_VAR = "SMELT_CKPT_DIR"
DEFAULT_DIR = "runs/dyck-pair"
ARCHS = ("baseline", "smelt")
TINY_DIR = Path(tempfile.gettempdir()) / "smelt-interp-notebooks" / "dyck-pair-tiny"


def pair_paths(root: Path) -> dict[str, Path]:
    return {arch: root / arch / "ckpt.pt" for arch in ARCHS}


def _complete(root: Path) -> bool:
    return all(p.is_file() for p in pair_paths(root).values())


def checkpoint_dir(verbose: bool = True, default: str | None = None) -> Path:
    """The folder holding the pair (see the module docstring); `default` is the folder read
    when $SMELT_CKPT_DIR is unset (None: DEFAULT_DIR; notebook 05 reads the recall pair)."""
    env = os.environ.get(ENV_VAR)
    root = (REPO / (env or default or DEFAULT_DIR)).resolve()
    if _complete(root):
        if verbose:
            print(f"checkpoint pair: {root}")
        return root
    if env:
        missing = ", ".join(str(p) for p in pair_paths(root).values() if not p.is_file())
        raise FileNotFoundError(
            f"{ENV_VAR}={env} must hold baseline/ckpt.pt and smelt/ckpt.pt; missing: "
            f"{missing}. Train a pair there with `python -m smelt_interp.train "
            f"--preset dyck-pair --out {env}`, or unset {ENV_VAR}."
        )
    print(
        f"The default pair ({root}) is not trained yet. Train it once with\n\n"
        f"    make train        # about 10 minutes per model on two CPU cores\n\n"
        f"or point {ENV_VAR} at a folder holding baseline/ckpt.pt and smelt/ckpt.pt.\n"
        f"Meanwhile this notebook uses the tiny preset dyck-pair-tiny ({TINY_DIR}): the code runs, "
        f"but its numbers say little."
    )
    if not _complete(TINY_DIR):
        from smelt_interp.train.config import TrainConfig
        from smelt_interp.train.presets import get_preset
        from smelt_interp.train.trainer import train_pair

        print("training dyck-pair-tiny (about a minute) ...", flush=True)
        train_pair(TrainConfig.from_dict(get_preset("dyck-pair-tiny")), TINY_DIR, progress=False)
    return TINY_DIR


def checkpoint_paths(verbose: bool = True, default: str | None = None) -> dict[str, Path]:
    """{'baseline': .../baseline/ckpt.pt, 'smelt': .../smelt/ckpt.pt}."""
    return pair_paths(checkpoint_dir(verbose, default))


def load_tokenizers(verbose: bool = False, default: str | None = None) -> dict:
    """Each model's tokenizer, as its checkpoint carries it: {'baseline': ..., 'smelt': ...}."""
    from smelt_interp.probes.text import tokenizer_of

    return {arch: tokenizer_of(path) for arch, path in checkpoint_paths(verbose, default).items()}


def load_pair(device: str = "cpu", verbose: bool = True, default: str | None = None) -> dict:
    """Both models, loaded in eval mode: {'baseline': SmeltModel, 'smelt': SmeltModel}."""
    from smelt_interp.loading import load_model

    models = {
        arch: load_model(path, device=device)[0]
        for arch, path in checkpoint_paths(verbose, default).items()
    }
    if verbose:
        for arch, m in models.items():
            c = m.cfg
            loop = c.loop_text
            print(
                f"  {arch:<8} d_model={c.d_model} layers={c.n_layers} "
                f"heads={c.n_heads}/{c.n_kv_heads} experts={c.n_experts} top_k={c.top_k}; "
                f"{loop}; effective depth {c.effective_depth}"
            )
    return models
