"""Every probe on one checkpoint, or side by side on a Baseline/SMELT pair, written as one JSON
file (summaries and tables) and one self-contained HTML page (plotly.js inlined) of the
figures the dashboard uses. A probe that does not apply to a model (routing on a Baseline) is
noted and skipped for that model. It loops over the registered probes
(smelt_interp.probes.registry) and draws each one's figures from its spec
(smelt_interp.figures.probes), so it names no probe.

    python -m smelt_interp.report smelt.pt [--compare baseline.pt] [--json OUT] [--html OUT]
"""

from __future__ import annotations

import html
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import plotly.graph_objects as go

from smelt_interp.checkpoint import CheckpointInfo
from smelt_interp.cli import run_cli
from smelt_interp.figures.case_study import over_training
from smelt_interp.figures.page import html_page
from smelt_interp.figures.probes import probe_figures
from smelt_interp.figures.sink_training import sink_over_training
from smelt_interp.files import atomic_write_many, check_outputs, json_text
from smelt_interp.loading import load_models
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes.cli import (
    build_parser,
    describe_models,
    format_table,
    input_paths,
    records,
    request_from_args,
    token_record,
)
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import ProbeOptions, ProbeSpec, registered
from smelt_interp.probes.session import ProbeResult, make_inputs, options, run_probe
from smelt_interp.provenance import METRICS_FILE
from smelt_interp.train.case_eval import case_history
from smelt_interp.train.sink_eval import sink_history


def build(
    models: dict[str, SmeltModel],
    inputs: ProbeInputs,
    opts: ProbeOptions | None = None,
    probes: Sequence[ProbeSpec] | None = None,
) -> dict[str, ProbeResult]:
    """Run every probe (default: every registered one) on every model, skipping where a probe
    does not apply."""
    opts = opts or ProbeOptions()
    return {
        spec.name: run_probe(spec, models, inputs, opts, skip_inapplicable=True)
        for spec in (registered() if probes is None else probes)
    }


def figures(
    results: dict[str, ProbeResult], probes: Sequence[ProbeSpec] | None = None
) -> dict[str, list[go.Figure]]:
    """Each probe's figures, drawn from its spec (`probes`: those `build` ran, default every
    registered one)."""
    specs = {spec.name: spec for spec in (registered() if probes is None else probes)}
    return {name: probe_figures(specs[name], r.per_model) for name, r in results.items()}


def payload(
    models: dict[str, SmeltModel],
    inputs: ProbeInputs,
    results: dict[str, ProbeResult],
    infos: Mapping[str, CheckpointInfo] | None = None,
) -> dict:
    """The report as JSON-ready data."""
    return {
        "models": describe_models(models, infos),
        "inputs": {
            "data": inputs.data,
            "n_seqs": inputs.n_seqs,
            "seq_len": inputs.seq_len,
            "demos": list(inputs.demos),
            "seed": inputs.seed,
            "prompt": inputs.prompt,
            "tokenizer_vocab": inputs.tokenizer.vocab_size,
            "tokens": token_record(inputs),
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
    infos: Mapping[str, CheckpointInfo] | None = None,
    inputs: ProbeInputs | None = None,
) -> str:
    """One self-contained page: plotly.js is inlined once, with the first figure. With
    `inputs`, the first probed row is shown as the models' tokenizer decodes it."""
    parts: list[str | go.Figure] = [f"<h1>Probe report: {html.escape(' vs '.join(models))}</h1>"]
    tokens = token_record(inputs) if inputs is not None else None
    if tokens is not None:
        shown = " ".join(f"<code>{html.escape(label)}</code>" for label in tokens["labels"][:200])
        parts.append(f"<p>first row probed, as the models' tokenizer reads it: {shown}</p>")
    for label, model in models.items():
        cfg = model.cfg
        loop = cfg.loop_text
        path = str(infos[label].path) if infos else ""
        parts.append(
            f"<p><b>{html.escape(label)}</b>: {html.escape(path)}; "
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
    if infos:
        parts.append("<h2>sink over training</h2>")
        histories = {n: sink_history(i.path.parent / METRICS_FILE) for n, i in infos.items()}
        parts.append(sink_over_training(histories, title="Attention sink over training"))
        cases = {n: case_history(i.path.parent / METRICS_FILE) for n, i in infos.items()}
        if any(not table.empty for table in cases.values()):  # runs trained on assoc_recall
            parts.append("<h2>case study over training</h2>")
            parts.append(over_training(cases, title="Case study over training"))
    return html_page("smelt-interp probe report", parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(
        "python -m smelt_interp.report",
        "Run every probe and write one JSON and one HTML report.",
        csv=False,
    )
    parser.add_argument(
        "--html", type=Path, metavar="OUT", help="HTML page (default <checkpoint>_report.html)"
    )
    args = parser.parse_args(argv)
    stem = args.checkpoint.stem
    outputs = {
        "--json": args.json or Path(f"{stem}_report.json"),
        "--html": args.html or Path(f"{stem}_report.html"),
    }
    check_outputs(input_paths(args), outputs)
    paths = [args.checkpoint] + ([args.compare] if args.compare else [])
    models, infos = load_models(paths, args.device, args.trust_remote_code, args.loop)
    request = request_from_args(args)
    inputs = make_inputs(request, models, infos)
    results = build(models, inputs, options(request))
    for name, result in results.items():
        print(f"== {name} ==")
        for label, why in result.skipped.items():
            print(f"({label}: skipped, {why})")
        print(format_table(result.summary) + "\n")
    texts = {
        outputs["--json"]: json_text(payload(models, inputs, results, infos)),
        outputs["--html"]: render_html(models, results, figures(results), infos, inputs),
    }
    for path in atomic_write_many(texts):  # both or neither
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_cli(main)
