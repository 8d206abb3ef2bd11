"""Every probe on one checkpoint, or side by side on a Baseline/SMELT pair, written as one JSON
file (summaries and tables) and one self-contained HTML page (plotly.js inlined) of the
figures the dashboard uses. A probe that does not apply to a model (routing on a Baseline) is
noted and skipped for that model.

    python -m smelt_interp.probes.report smelt.pt [--compare baseline.pt] [--json OUT] [--html OUT]
"""

from __future__ import annotations

import html
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from smelt_interp.atomic import atomic_write_text, json_text
from smelt_interp.cli import run_cli
from smelt_interp.figures import dyck as dyck_figs
from smelt_interp.figures import loop as loop_figs
from smelt_interp.figures.page import html_page
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes import dyck, lens, residual, routing, similarity, sink
from smelt_interp.probes.cli import (
    ProbeResult,
    build_parser,
    describe_models,
    load_models,
    make_inputs,
    options,
    run_probe,
)
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.output import format_table, records
from smelt_interp.probes.spec import ProbeOptions, ProbeSpec, Tables

PROBES: tuple[ProbeSpec, ...] = (
    sink.PROBE,
    routing.PROBE,
    similarity.PROBE,
    residual.PROBE,
    dyck.PROBE,
    lens.PROBE,
)


def per_model(stacked: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """A table stacked over models (the leading `model` column of run_probe's tables) as
    {model: its rows}, models in first-seen order: what the figure functions take. The `model`
    column goes, and so do columns left all NaN (those only another model's table has, such as
    a Baseline's visit-vs-visit similarity)."""
    return {
        str(label): rows.drop(columns="model").dropna(axis=1, how="all").reset_index(drop=True)
        for label, rows in stacked.groupby("model", sort=False)
    }


def dyck_answer_mass(visits: pd.DataFrame) -> pd.DataFrame:
    """probes.dyck.by_visit rows averaged over the prompts with demonstrations (over all prompts
    when none has any): one row per (layer, visit), as figures.dyck takes them."""
    if (visits["n_demos"] > 0).any():
        visits = visits[visits["n_demos"] > 0]
    return (
        visits.groupby(["layer", "visit", "depth"], as_index=False)[["bos_mass", "demo_mass"]]
        .mean()
        .sort_values("depth", ignore_index=True)
    )


def _routing(t: Tables) -> list[go.Figure]:
    return [
        loop_figs.routing_overlap(
            per_model(t["overlap"]), title="Experts shared by the two visits (dash: chance k²/E)"
        )
    ] + [
        loop_figs.expert_usage(usage, title=f"{label}: expert usage per visit")
        for label, usage in per_model(t["usage"]).items()
    ]


def _dyck(t: Tables) -> list[go.Figure]:
    frames = {label: dyck_answer_mass(visits) for label, visits in per_model(t["visits"]).items()}
    return [
        dyck_figs.mass_by_depth(
            frames, title="Dyck: attention from the answer positions (prompts with demonstrations)"
        ),
        dyck_figs.paper_comparison(
            frames, title="Dyck: loop-span means per visit, ours and the paper"
        ),
    ]


FIGURES: dict[str, Callable[[Tables], list[go.Figure]]] = {
    "sink": lambda t: [
        loop_figs.sink_by_depth(
            per_model(t["visits"]), title="Attention-sink mass by effective depth"
        )
    ],
    "routing": _routing,
    "similarity": lambda t: [
        loop_figs.qkv_similarity(
            heads,
            model=label,
            title=f"{label}: similarity of the visits, beside layer l vs l + 1 (bands: paper)",
        )
        for label, heads in per_model(t["heads"]).items()
    ],
    "residual": lambda t: [
        loop_figs.residual_writes(
            per_model(t["writes"]), title="Residual writes by effective depth"
        )
    ],
    "dyck": _dyck,
    "lens": lambda t: [
        loop_figs.lens_ce(per_model(t["depths"]), title="Logit lens by effective depth")
    ],
}


def build(
    models: dict[str, SmeltModel],
    inputs: ProbeInputs,
    opts: ProbeOptions | None = None,
    probes: Sequence[ProbeSpec] = PROBES,
) -> dict[str, ProbeResult]:
    """Run every probe on every model (skipping where a probe does not apply)."""
    opts = opts or ProbeOptions()
    return {
        spec.name: run_probe(spec, models, inputs, opts, skip_inapplicable=True) for spec in probes
    }


def figures(results: dict[str, ProbeResult]) -> dict[str, list[go.Figure]]:
    return {name: FIGURES[name](r.tables) if r.tables else [] for name, r in results.items()}


def payload(
    models: dict[str, SmeltModel],
    inputs: ProbeInputs,
    results: dict[str, ProbeResult],
    checkpoints: Mapping[str, Path] | None = None,
) -> dict:
    """The report as JSON-ready data."""
    return {
        "models": describe_models(models, checkpoints),
        "inputs": {
            "data": inputs.data,
            "n_seqs": inputs.n_seqs,
            "seq_len": inputs.seq_len,
            "demos": list(inputs.demos),
            "seed": inputs.seed,
        },
        "probes": {
            name: {
                "summary": records(r.summary),
                "skipped": r.skipped,
                "tables": {t: records(df) for t, df in r.tables.items()},
            }
            for name, r in results.items()
        },
    }


def render_html(
    models: dict[str, SmeltModel],
    results: dict[str, ProbeResult],
    figures_by_probe: dict[str, list[go.Figure]],
    checkpoints: Mapping[str, Path] | None = None,
) -> str:
    """One self-contained page: plotly.js is inlined once, with the first figure."""
    parts: list[str | go.Figure] = [f"<h1>Probe report: {html.escape(' vs '.join(models))}</h1>"]
    for label, model in models.items():
        cfg = model.cfg
        loop = (
            f"layers {cfg.loop_start}..{cfg.loop_end - 1} x{cfg.n_loops}"
            if cfg.is_looped
            else "none"
        )
        parts.append(
            f"<p><b>{html.escape(label)}</b>: "
            f"{html.escape(str((checkpoints or {}).get(label, '')))}; "
            f"{cfg.n_layers} layers, loop {loop}, d_model {cfg.d_model}, {cfg.n_experts} experts "
            f"(top-{cfg.top_k}), {cfg.n_heads}/{cfg.n_kv_heads} heads</p>"
        )
    for name, result in results.items():
        parts.append(f"<h2>{html.escape(name)}</h2>")
        for label, why in result.skipped.items():
            parts.append(f"<p><i>{html.escape(label)}: not applicable ({html.escape(why)})</i></p>")
        if len(result.summary):
            parts.append(
                result.summary.to_html(index=False, float_format=lambda v: f"{v:.4f}", na_rep="–")
            )
        parts.extend(figures_by_probe.get(name, []))
    return html_page("smelt-interp probe report", parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(
        "python -m smelt_interp.probes.report",
        "Run every probe and write one JSON and one HTML report.",
        csv=False,
    )
    parser.add_argument(
        "--html", type=Path, metavar="OUT", help="HTML page (default <checkpoint>_report.html)"
    )
    args = parser.parse_args(argv)
    paths = [args.checkpoint] + ([args.compare] if args.compare else [])
    models = load_models(paths, args.device)
    inputs = make_inputs(args, models)
    results = build(models, inputs, options(args))
    for name, result in results.items():
        print(f"== {name} ==")
        for label, why in result.skipped.items():
            print(f"({label}: skipped, {why})")
        print(format_table(result.summary) + "\n")
    stem = args.checkpoint.stem
    json_path = args.json or Path(f"{stem}_report.json")
    html_path = args.html or Path(f"{stem}_report.html")
    checkpoints = dict(zip(models, paths))
    page = render_html(models, results, figures(results), checkpoints)
    data = json_text(payload(models, inputs, results, checkpoints))
    print(f"wrote {atomic_write_text(json_path, data)}", file=sys.stderr)
    print(f"wrote {atomic_write_text(html_path, page)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_cli(main)
