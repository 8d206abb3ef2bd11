"""What a run may use on this machine, checked before any work starts: the memory a request
needs against what is available (`require_memory`) and the device it names (`parse_device`).
Every caller, command line or not, refuses the same way: one ConfigError line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from smelt_interp.errors import ConfigError
from smelt_interp.machine import GIB, available_memory

if TYPE_CHECKING:
    import torch


def require_memory(need: int, what: str) -> None:
    """Refuse, before any work, `what` (the flags asking for it) when its estimated `need` in
    bytes exceeds the memory available: one line with both sizes."""
    have = available_memory()
    if need > have:
        raise ConfigError(
            f"{what} needs about {need / GIB:,.1f} GiB of memory; "
            f"{have / GIB:,.1f} GiB is available"
        )


RUNNABLE_DEVICES = ("cpu", "cuda")  # meta holds no data; mps and the rest are untested


def parse_device(text: str | None) -> torch.device:
    """The torch device `--device text` names, checked to be one this machine can run a model
    on: `cpu`, or `cuda`/`cuda:N` where that GPU exists (None: cuda when available, else cpu).
    Anything else (`meta`, `mps`, `cuda/foo`, a missing GPU) is a one-line ConfigError."""
    import torch  # here, so commands without models (the scaling fit) start without torch

    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(
            f"--device {text!r}: not a device name (use cpu, cuda or cuda:N)"
        ) from None
    if device.type not in RUNNABLE_DEVICES:
        raise ConfigError(
            f"--device {text!r}: models run on cpu or cuda here, not on {device.type}"
        )
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"--device {text!r}: no CUDA device is available here")
        if device.index is not None and device.index >= count:
            raise ConfigError(
                f"--device {text!r}: this machine has {count} CUDA device(s) (0..{count - 1})"
            )
    return device
