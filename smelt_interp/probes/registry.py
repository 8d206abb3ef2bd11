"""The probe contract and the one list of probes.

A probe module declares one `PROBE = ProbeSpec(...)`: its name, how to run it on a model
(`run` -> named tidy tables, the first the main one), how to condense those tables into a few
headline statistics beside the paper's values (`summarize`), the figures that draw them
(`FigureSpec`s, rendered by smelt_interp.figures.probes). The report, the notebooks and the
dashboard loop over `registered()`, so nothing else names a probe; where the dashboard shows
each one is the app's choice. The list holds the built-in probes (BUILTIN), then the probes of
installed packages (entry points of group PLUGIN_GROUP, each naming a ProbeSpec:
`name = "package.module:PROBE"`), then those added with `register`. Probe modules are imported
only when the list is first asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from smelt_interp.errors import ProbeError
from smelt_interp.measure.attention_stats import DEFAULT_CHUNK
from smelt_interp.measure.batching import DEFAULT_BATCH
from smelt_interp.model.protocol import LoopedModel
from smelt_interp.plugins import installed
from smelt_interp.probes.inputs import ProbeInputs

Tables = dict[str, pd.DataFrame]
SUMMARY_COLUMNS = ("statistic", "value", "paper")

# Modules under smelt_interp.probes, each with a PROBE spec; the report's order.
BUILTIN = (
    "sink",
    "routing",
    "similarity",
    "residual",
    "case_study",
    "lens",
    "dla",
    "head_ablation",
    "patching",
    "linear_probe",
)
PLUGIN_GROUP = "smelt_interp.probes"  # entry points of installed probes


@dataclass(frozen=True)
class ProbeOptions:
    """Knobs shared by the probes: rows per forward pass and queries per attention chunk."""

    batch_size: int = DEFAULT_BATCH
    chunk: int = DEFAULT_CHUNK


@dataclass(frozen=True)
class FigureSpec:
    """One figure of a probe: `kind` names a renderer in smelt_interp.figures.probes, `table`
    the probe table it draws, `y` the column for generic kinds such as "by_depth";
    `per_model` draws one figure per model (titled "<model>: <title>")."""

    kind: str
    table: str
    title: str
    y: str | None = None
    per_model: bool = False


@dataclass(frozen=True)
class ProbeSpec:
    """One probe as the commands, the report and the dashboard see it. `tables` names what
    `run` returns (the first is the main table)."""

    name: str
    description: str
    run: Callable[[LoopedModel, ProbeInputs, ProbeOptions], Tables]
    summarize: Callable[[Tables], pd.DataFrame]
    tables: tuple[str, ...]
    figures: tuple[FigureSpec, ...] = ()


def summary(rows: list[tuple[str, float, str]]) -> pd.DataFrame:
    """A summary table from (statistic, value, paper) triples; paper is '' where it gives none."""
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


_builtins: list[ProbeSpec] = []
_plugins: dict[str, ProbeSpec] = {}
_extras: dict[str, ProbeSpec] = {}


def _load_builtins() -> list[ProbeSpec]:
    if not _builtins:
        _builtins.extend(
            importlib.import_module(f"smelt_interp.probes.{name}").PROBE for name in BUILTIN
        )
        load_plugins()
    return _builtins


def load_plugins() -> tuple[ProbeSpec, ...]:
    """(Re)read the probes of installed packages: the entry points of PLUGIN_GROUP. Runs once
    when the list is first asked for; call it again after installing a package. An entry point
    that does not load, is not a ProbeSpec, or reuses a name is a ProbeError."""
    found: dict[str, ProbeSpec] = {}
    for value, spec in installed(PLUGIN_GROUP, ProbeSpec, "probe plugin", ProbeError):
        if spec.name in BUILTIN or spec.name in found or spec.name in _extras:
            raise ProbeError(f"probe plugin {value!r}: a probe named {spec.name!r} exists")
        found[spec.name] = spec
    _plugins.clear()
    _plugins.update(found)
    return tuple(found.values())


def register(spec: ProbeSpec) -> ProbeSpec:
    """Add a probe after the built-in ones (returns it, so `PROBE = register(ProbeSpec(...))`)."""
    if spec.name in BUILTIN or spec.name in _plugins or spec.name in _extras:
        raise ProbeError(f"a probe named {spec.name!r} is already registered")
    _extras[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a probe added with `register` (for tests)."""
    if _extras.pop(name, None) is None:
        raise ProbeError(f"no registered probe named {name!r} (built-in probes stay)")


def registered() -> tuple[ProbeSpec, ...]:
    """Every probe: the built-in ones in BUILTIN order, then the installed plugins', then the
    registered ones in order."""
    return (*_load_builtins(), *_plugins.values(), *_extras.values())


def get(name: str) -> ProbeSpec:
    """The probe named `name`; ProbeError listing the known names otherwise."""
    for spec in registered():
        if spec.name == name:
            return spec
    known = ", ".join(spec.name for spec in registered())
    raise ProbeError(f"unknown probe {name!r}; the probes are {known}")
