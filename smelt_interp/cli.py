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

from smelt_interp.errors import SmeltError

if TYPE_CHECKING:
    pass

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


def add_overrides(parser: argparse.ArgumentParser, help_text: str) -> None:
    """The repeatable `--set KEY=VALUE` flag every training command takes (values parsed by
    smelt_interp.train.build.parse_override)."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help_text
    )
