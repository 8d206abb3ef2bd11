"""Write an associative-recall seeds report's Markdown again from its JSON, without training or
probing: with the current tables (commands.recall_seed_tables), and with seeds left out where a
seed cannot serve as a test seed (`--drop-seeds 0 --why "..."`: a recipe chosen on seed-0 runs).
The JSON stays the record of every seed measured; the Markdown names what it left out and why,
and the command and commit that measured the JSON.

    python -m smelt_interp.commands.seed_rerender docs/results/recall_seeds.json \\
        --drop-seeds 0 --why "the recipe was chosen on seed-0 runs (recall_sweep.md)"
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from smelt_interp.cli import ArgumentParser, run_cli
from smelt_interp.commands import recall_seed_tables
from smelt_interp.commands.seed_report import JSON_NAMES
from smelt_interp.errors import ConfigError
from smelt_interp.files import atomic_write_text, read_input_text, read_json_input
from smelt_interp.results import command_line, results_text

MAX_BYTES = 64 << 20
GENERATED = "Over "  # the first generated paragraph ("Over N seeds, each mass cell: ...")


def parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", type=Path, help="a seeds report's JSON (commands.seeds, recall)")
    p.add_argument("--drop-seeds", type=int, nargs="*", default=[], help="seeds to leave out")
    p.add_argument("--why", default="", help="why those seeds are left out (said in the file)")
    return p


def read_report(path: Path) -> dict[str, Any]:
    """The JSON report at `path`, refused (ConfigError) unless an associative-recall one."""
    report = read_json_input(path, MAX_BYTES, ConfigError, "seeds report")
    if not isinstance(report, dict):
        raise ConfigError(f"{path}: not an associative-recall seeds report (commands.seeds)")
    per_seed = report.get("per_seed")
    if report.get("task") != "assoc_recall" or not isinstance(per_seed, dict):
        raise ConfigError(f"{path}: not an associative-recall seeds report (commands.seeds)")
    missing = [n for n in (*JSON_NAMES.values(), "by_model") if n not in per_seed]
    if missing:
        raise ConfigError(f"{path}: an older report without {', '.join(missing)}; not rewritten")
    return report


def frames(
    report: dict[str, Any], drop: Sequence[int]
) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """(per-seed case-study frames under their table names, per-model frame), `drop` left out."""
    keep = lambda records: [r for r in records if r["seed"] not in drop]  # noqa: E731
    per_seed = {
        name: pd.DataFrame(keep(report["per_seed"][json_name]))
        for name, json_name in JSON_NAMES.items()
    }
    return per_seed, pd.DataFrame(keep(report["per_seed"]["by_model"]))


def preface(old: str) -> str:
    """The hand-written paragraphs of an existing Markdown report: after its title, before the
    generated tables, without the header lines and this command's own note ('' when none)."""
    kept = []
    for block in old.split("\n\n")[1:]:
        if block.startswith((GENERATED, "Seeds left out")):
            break
        if not block.startswith(("Command: ", "Measured by ")):
            kept.append(block)
    return "\n\n".join(kept)


def title_of(old: str, preset: str, shown: str) -> str:
    """The report's title with its seed count replaced by the seeds shown."""
    first = old.split("\n", 1)[0].removeprefix("# ").strip() if old.startswith("# ") else ""
    stem = re.sub(r": (\d+ seeds|seeds [\d, ]+)$", "", first) or preset
    return f"{stem}: seeds {shown}"


def rerender_main(argv: Sequence[str] | None = None) -> int:
    argv = list(argv) if argv is not None else sys.argv[1:]
    args = parser().parse_args(argv)
    report = read_report(args.json)
    seeds = [s for s in report["seeds"] if s not in args.drop_seeds]
    if len(seeds) < 2:
        raise ConfigError(f"--drop-seeds leaves {len(seeds)} seed(s); nothing to compare")
    per_seed, models = frames(report, args.drop_seeds)
    body = recall_seed_tables.markdown(
        recall_seed_tables.summarize(per_seed, models), per_seed, models
    )
    md_path = args.json.with_suffix(".md")
    old = (
        read_input_text(md_path, MAX_BYTES, ConfigError, "results file")
        if md_path.is_file()
        else ""
    )
    shown = ", ".join(map(str, seeds))
    note = (
        f"Measured by `{report['command']}` at commit {report['commit']} on seeds "
        f"{', '.join(map(str, report['seeds']))}; this file is written again from its JSON "
        f"(`{args.json.name}`, every seed kept there)."
    )
    if args.drop_seeds:
        note += f"\n\nSeeds left out: {', '.join(map(str, args.drop_seeds))}. {args.why}".rstrip()
    title = title_of(old, report["preset"], shown)
    parts = [p for p in (preface(old), note, body) if p]
    command = command_line("smelt_interp.commands.seed_rerender", argv)
    atomic_write_text(md_path, results_text(title, command, parts))
    print(f"wrote {md_path}")
    return 0


if __name__ == "__main__":
    run_cli(rerender_main)
