"""Shared plumbing for the package's commands: an argument parser whose errors are one line,
a runner that turns any SmeltError into `error: ...` on stderr and exit code 2, the one
parser of `--device` every command uses, and the up-front check that asked-for work fits in
memory."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from smelt_interp.errors import ConfigError, SmeltError
from smelt_interp.machine import GIB, available_memory

if TYPE_CHECKING:
    import torch

EXIT_USAGE = 2


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad flag prints one line (`prog: error: ...`) instead of usage + error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type`: an integer >= `minimum` (a bad value is argparse's one line)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


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


def run_cli(
    main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None
) -> NoReturn:
    """Run a command's `main`, mapping package errors and bad files to a one-line message."""
    try:
        code = main(argv)
    except SmeltError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        # the reader went away (`... | head`): stop quietly, as the Python docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except (OSError, UnicodeDecodeError) as exc:  # a file that cannot be read or written
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    sys.exit(code or 0)
