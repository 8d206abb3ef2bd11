"""`python -m smelt_interp.probes NAME ckpt.pt [flags]`: run any registered probe by name.

NAME is a probe of the registry (the built-in ones, those of installed packages, see
registry.PLUGIN_GROUP) or `package.module:ATTR` for a ProbeSpec in a module that is importable
but not installed as a plugin. The flags are the shared ones of probes.cli; `python -m
smelt_interp.probes.sink ckpt.pt` is the same command as `python -m smelt_interp.probes sink
ckpt.pt`. With no NAME it lists the probes."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from smelt_interp.cli import run_cli
from smelt_interp.errors import ProbeError
from smelt_interp.probes.cli import probe_main
from smelt_interp.probes.registry import ProbeSpec, get, load_plugins, registered

USAGE = "usage: python -m smelt_interp.probes NAME ckpt.pt [flags]   (NAME --help for the flags)"


def resolve(name: str) -> ProbeSpec:
    """The probe `name` names: a registered one, or `module:attr` holding a ProbeSpec."""
    if ":" not in name:
        return get(name)
    module, _, attr = name.partition(":")
    if not module or module.startswith(".") or not attr:
        raise ProbeError(
            f"probe {name!r}: give an absolute module and a name, as package.module:ATTR"
        )
    try:
        spec = getattr(importlib.import_module(module), attr)
    except (ImportError, ValueError, TypeError) as exc:
        raise ProbeError(f"cannot import probe module {module!r}: {exc}") from None
    except AttributeError:
        raise ProbeError(f"module {module!r} has no {attr!r}") from None
    if not isinstance(spec, ProbeSpec):
        raise ProbeError(f"{name} is a {type(spec).__name__}, not a ProbeSpec")
    return spec


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    load_plugins()  # the installed packages' probes as they are now
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        for spec in registered():
            print(f"  {spec.name:<12} {spec.description}")
        return 0
    return probe_main(resolve(args[0]), args[1:])


if __name__ == "__main__":
    run_cli(main)
