"""`python -m smelt_interp.commands.real_lm_results` (after `make real-lm`): the real pretrained
model (SmolLM2-135M-Instruct) as it is and with spans of its layers looped at inference,
measured by the workbench's own probes, into docs/results/real_lm.md (.json beside).

    python -m smelt_interp.commands.real_lm_results [--model models/smollm2-135m]
        [--spans 14:16,12:18,8:22,20:26] [--n-seqs 4] [--sink-rows 32] [--loss-rows 16]

For the unlooped model and each FOLDER@SPAN (x2 unless the span says xR): the sink probe on
--sink-rows held-out rows of 64 tokens of Python source (`--data code`: the running Python's
standard library), per (layer, visit) the head-mean first-token mass and Sink^0.3; the held-out
next-token loss on --loss-rows rows of 256 tokens of the same source (measure.lm_loss); the case
study (in-context Dyck, 0, 1, 2 and 4 demonstrations, --n-seqs prompts each, in the model's own
tokens) per (layer, visit): first-token and demonstration-answer mass at the answer positions,
and greedy exact-match accuracy. Each looped visit's change is set beside the unlooped model's
own change between the layers at the same depths (visit 0 of layer l runs at depth l, visit v
at depth l + v * (END - START)). Nothing is tuned: one seed, one pass, float32 on the CPU."""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from smelt_interp.adapters.inference_loop import parse_loop
from smelt_interp.adapters.real_lm import FOLDER, manifest_problem
from smelt_interp.cli import ArgumentParser, run_cli
from smelt_interp.errors import CheckpointError, ConfigError
from smelt_interp.files import atomic_write_text, json_text, read_json_input
from smelt_interp.loading import load_model
from smelt_interp.measure.lm_loss import next_token_loss
from smelt_interp.probes import registry
from smelt_interp.probes.inputs import ProbeRequest
from smelt_interp.probes.session import make_inputs, options, run_probe
from smelt_interp.results import (
    command_line,
    markdown_table,
    results_text,
    source_commit,
    table_block,
)

MODULE = "smelt_interp.commands.real_lm_results"
SPANS = "14:16,12:18,8:22,20:26"
UNLOOPED = "unlooped"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def per_visit(df: pd.DataFrame, columns: dict[str, str]) -> list[dict[str, Any]]:
    """Records of (layer, visit, depth) and the head means of `columns` ({source: name})."""
    grouped = df.groupby(["layer", "visit", "depth"], as_index=False)[list(columns)].mean()
    return grouped.rename(columns=columns).to_dict("records")


def measure_model(label: str, path: str, args: argparse.Namespace) -> dict[str, Any]:
    """Everything measured on one model (the folder, or FOLDER@SPAN)."""
    say(f"[{label}] loading {path}")
    model, info = load_model(path, "cpu")
    models, infos = {label: model}, {label: info}
    out: dict[str, Any] = {"label": label, "schedule": [list(s) for s in model.schedule]}

    say(f"[{label}] sink probe: {args.sink_rows} rows of 64 tokens of Python source")
    code64 = ProbeRequest(data="code", n_seqs=args.sink_rows, seq_len=64, batch_size=8)
    inputs = make_inputs(code64, models, infos)
    heads = run_probe(registry.get("sink"), models, inputs, options(code64)).tables["heads"]
    heads = heads.assign(sink03=heads["is_sink_64"].astype(float))
    out["code_visits"] = per_visit(heads, {"sink_mass_64": "first_mass", "sink03": "sink03"})
    out["code_sink03"] = float(heads["sink03"].mean())
    out["code_first_mass"] = float(heads["sink_mass_64"].mean())

    say(f"[{label}] held-out loss: {args.loss_rows} rows of 256 tokens")
    code256 = ProbeRequest(data="code", n_seqs=args.loss_rows, seq_len=256)
    tokens, lengths = make_inputs(code256, models, infos).batch()
    out["loss"] = next_token_loss(model, tokens, lengths, batch=4)
    out["loss_tokens"] = int(lengths.sum()) - len(lengths)

    say(f"[{label}] case study: in-context Dyck, {args.n_seqs} prompts per demonstration count")
    case = ProbeRequest(data="dyck", n_seqs=args.n_seqs, demos=(0, 1, 2, 4), batch_size=4)
    case_inputs = make_inputs(case, models, infos)
    tables = run_probe(registry.get("case_study"), models, case_inputs, options(case)).tables
    answer = tables["answer"]
    out["answer_visits"] = [
        {k: row[k] for k in ("layer", "visit", "depth", "bos_mean", "demo_mean", "bos_uniform")}
        for row in answer.to_dict("records")
    ]
    out["accuracy"] = tables["accuracy"][["n_demos", "n", "accuracy", "kind"]].to_dict("records")
    out["dyck_sink03"] = float(tables["sink"]["sink03_64"].iloc[0])
    first = case_inputs.dyck_examples()[0].ids[0]
    out["first_token"] = {"id": int(first), "label": info.tokenizer.token_labels([first])[0]}
    del model, models
    gc.collect()
    return out


def measure_all(args: argparse.Namespace) -> dict[str, Any]:
    problem = manifest_problem(args.model)
    if problem is not None:
        raise CheckpointError(f"{problem}: prepare the model first (make real-lm)")
    spans = [parse_loop(s) for s in args.spans.split(",") if s.strip()]
    runs = [(UNLOOPED, str(args.model))] + [(s.text, f"{args.model}@{s.text}") for s in spans]
    return {
        "model": str(args.model),
        "spans": [[s.start, s.end, s.repeats] for s in spans],
        "runs": [measure_model(label, path, args) for label, path in runs],
    }


# ----- the page -------------------------------------------------------------------------------
def signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.3f}"


def f3(value: float | None) -> str:
    return "–" if value is None or value != value else f"{value:.3f}"


def keyed(records: list[dict[str, Any]], field: str) -> dict[tuple[int, int], float]:
    return {(int(r["layer"]), int(r["visit"])): float(r[field]) for r in records}


def span_layers(span: list[int]) -> range:
    return range(span[0], span[1])


def headline_rows(data: dict[str, Any]) -> list[list[str]]:
    """Per model: loss, code-row first-token mass and Sink^0.3, the answer masses over the
    looped layers (visit 0 -> last visit; every layer for the unlooped model), accuracy."""
    rows = []
    base = data["runs"][0]
    for run, span in zip(data["runs"], [None, *data["spans"]]):
        bos, demo = (
            keyed(run["answer_visits"], "bos_mean"),
            keyed(run["answer_visits"], "demo_mean"),
        )
        if span is None:
            answers = f"{f3(sum(bos.values()) / len(bos))} (mean over layers)"
            demos = f3(sum(demo.values()) / len(demo))
        else:
            layers, last = span_layers(span), span[2] - 1
            mean = lambda d, v: sum(d[(lay, v)] for lay in layers) / len(layers)  # noqa: E731
            answers = f"{f3(mean(bos, 0))} to {f3(mean(bos, last))}"
            demos = f"{f3(mean(demo, 0))} to {f3(mean(demo, last))}"
        accuracy = "; ".join(
            ", ".join(f"{a['accuracy']:.0%}" for a in run["accuracy"] if a["kind"] == kind)
            for kind in ("exact_match", "teacher_forced")
        )
        change = "" if span is None else f" ({run['loss'] - base['loss']:+.3f})"
        rows.append([run["label"], f"{f3(run['loss'])}{change}", f3(run["code_first_mass"]),
                     f3(run["code_sink03"]), answers, demos, accuracy])  # fmt: skip
    return rows


def layer_rows(run: dict[str, Any]) -> list[list[str]]:
    """The unlooped model layer by layer."""
    code, sink = keyed(run["code_visits"], "first_mass"), keyed(run["code_visits"], "sink03")
    bos, demo = keyed(run["answer_visits"], "bos_mean"), keyed(run["answer_visits"], "demo_mean")
    return [
        [str(layer), f3(code[key]), f3(sink[key]), f3(bos[key]), f3(demo[key])]
        for layer, key in ((k[0], k) for k in sorted(code))
    ]


def change_cell(
    now: dict[tuple[int, int], float],
    unlooped: dict[tuple[int, int], float],
    layer: int,
    visit: int,
    depth: int,
) -> str:
    """'+a / +b': the visit's change from visit 0, the unlooped model's from layer `layer` to
    the layer at `depth` ('–' past its last layer); '' for visit 0."""
    if visit == 0:
        return ""
    own = unlooped.get((depth, 0))
    change = now[(layer, visit)] - now[(layer, 0)]
    return f"{change:+.3f} / " + ("–" if own is None else f"{own - unlooped[(layer, 0)]:+.3f}")


def visit_rows(data: dict[str, Any]) -> list[list[str]]:
    """Each looped layer's visits, with the unlooped model's own change between the layers at
    the same depths beside the change from visit 0."""
    base = data["runs"][0]
    fields = ("bos_mean", "demo_mean")
    ref = [
        *(keyed(base["answer_visits"], f) for f in fields),
        keyed(base["code_visits"], "first_mass"),
    ]
    rows = []
    for run, span in zip(data["runs"][1:], data["spans"]):
        got = [
            *(keyed(run["answer_visits"], f) for f in fields),
            keyed(run["code_visits"], "first_mass"),
        ]
        for layer in span_layers(span):
            for visit in range(span[2]):
                depth = layer + visit * (span[1] - span[0])
                cells = [run["label"], str(layer), str(visit), str(depth)]
                for now, unlooped in zip(got, ref):
                    cells += [
                        f3(now[(layer, visit)]),
                        change_cell(now, unlooped, layer, visit, depth),
                    ]
                rows.append(cells)
    return rows


def span_changes(data: dict[str, Any], field: str) -> list[tuple[str, float, float | None]]:
    """Per loop: (label, mean over its looped layers of the last visit's change from visit 0 in
    `field` at the answers, the unlooped model's mean change between the same depths where
    they lie within it, else None)."""
    base = keyed(data["runs"][0]["answer_visits"], field)
    out = []
    for run, span in zip(data["runs"][1:], data["spans"]):
        now, last = keyed(run["answer_visits"], field), span[2] - 1
        changes, own = [], []
        for layer in span_layers(span):
            changes.append(now[(layer, last)] - now[(layer, 0)])
            depth = layer + last * (span[1] - span[0])
            if (depth, 0) in base:
                own.append(base[(depth, 0)] - base[(layer, 0)])
        out.append(
            (run["label"], sum(changes) / len(changes), sum(own) / len(own) if own else None)
        )
    return out


def reading(data: dict[str, Any]) -> str:
    """What the tables show, in words generated from them (no figure typed by hand)."""
    base = data["runs"][0]
    losses = ", ".join(f"{r['label']} {r['loss'] - base['loss']:+.3f}" for r in data["runs"][1:])
    parts = [f"Held-out loss against the unlooped model's {f3(base['loss'])}: {losses} nats."]
    for field, what in (("bos_mean", "first-token"), ("demo_mean", "demonstration-answer")):
        cells = "; ".join(
            f"{label} {change:+.3f} (unlooped, same depths: {signed(own)})"
            for label, change, own in span_changes(data, field)
        )
        parts.append(
            f"At the answer positions, the looped layers' {what} mass changes from visit 0 to "
            f"the last visit by (head mean, mean over the span's layers): {cells}."
        )
    return " ".join(parts)


def page(data: dict[str, Any], command: str) -> str:
    base = data["runs"][0]
    first = base["first_token"]
    headline = markdown_table(
        ["model", "held-out loss (change)", "first-token mass, code", "Sink^0.3, code",
         "first-token mass at the answers", "demonstration-answer mass",
         "accuracy 0/1/2/4 demos: greedy; teacher-forced"],
        headline_rows(data),
    )  # fmt: skip
    layers = markdown_table(
        ["layer", "first-token mass, code", "Sink^0.3, code", "first-token mass at the answers",
         "demonstration-answer mass"],
        layer_rows(base),
    )  # fmt: skip
    visits = markdown_table(
        ["loop", "layer", "visit", "depth", "first-token mass at the answers",
         "change from visit 0 / unlooped change at that depth", "demonstration-answer mass",
         "change / unlooped change", "first-token mass, code", "change / unlooped change"],
        visit_rows(data),
    )  # fmt: skip
    parts = [
        f"SmolLM2-135M-Instruct ({data['model']}, prepared by `make real-lm`: Q4_1 weights "
        "dequantised to float32), unlooped and with spans of its own layers run again at "
        "inference, untrained, every write added in full (no 1/r scale). This tokenizer adds no "
        f"BOS: the first position holds the text's own first token (in every Dyck prompt "
        f"`{first['label']}`, id {first['id']}), and first-token mass is the attention on it. "
        "Code rows: held-out Python source (the running interpreter's standard library), 64 "
        "tokens a row for the masses and Sink^0.3 (share of heads whose mean mass on the first "
        "token over queries 1..63 exceeds 0.3), 256 for the loss (mean next-token "
        f"cross-entropy in nats over {base['loss_tokens']} predicted tokens). Answers: the answer "
        "positions of in-context Dyck prompts with 0, 1, 2 and 4 demonstrations, pooled (head "
        "means); accuracy is exact match of the answer, greedy and teacher-forced (the case-study "
        "probe's two kinds). Paper (SMELT trained with its loop, "
        "Dyck case study): first-token mass at the answers 0.60 at the first visit to 0.02 at the "
        "second, demonstration-answer mass 0.24 to 0.85.",
        reading(data),
        "Per model (a loop's answer masses: head mean over its looped layers, visit 0 to its last "
        "visit):",
        table_block("headline", headline),
        "The unlooped model layer by layer:",
        layers,  # the README shows the headline only
        "Each looped layer's visits. A visit's change is set against the unlooped model's own "
        "change between the layers at the same depths (visit v of layer l runs at depth "
        "l + v x (END - START); the unlooped layer at that depth minus layer l; – past the "
        "last layer):",
        visits,
    ]
    title = "SmolLM2-135M, as it is and looped at inference"
    return results_text(title, command, parts, data.get("commit"))  # the measuring commit


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=FOLDER)
    p.add_argument("--spans", default=SPANS, help=f"loop spans, comma-separated (default {SPANS})")
    p.add_argument("--n-seqs", type=int, default=4, help="Dyck prompts per demonstration count")
    p.add_argument("--sink-rows", type=int, default=32)
    p.add_argument("--loss-rows", type=int, default=16)
    p.add_argument("--out", type=Path, default=Path("docs/results/real_lm.md"))
    p.add_argument("--from-json", type=Path, default=None, help="render an earlier run's JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.from_json is not None:
        data = read_json_input(args.from_json, 64 << 20, ConfigError, "results JSON")
        argv = data["argv"]
    else:
        data = {**measure_all(args), "argv": argv, "commit": source_commit()}
        atomic_write_text(args.out.with_suffix(".json"), json_text(data))
    atomic_write_text(args.out, page(data, command_line(MODULE, argv)))
    say(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    run_cli(main)
