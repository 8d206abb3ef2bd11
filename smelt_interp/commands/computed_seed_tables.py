"""What the computed-recall seeds command (commands.computed_seeds) measures on each final
checkpoint, and the report it writes: the pre-registered study of docs/results/computed_recall.md.

Per seed s, three runs (RUNS): the deep-key Baseline and SMELT, and the shallow-key SMELT. Each
final checkpoint is measured on held-out rows of its own spec and trained row length
(probes.computed_inputs), every set of `n_rows` rows from its own seed namespace:

- answer and query accuracy (measure.case_accuracy.computed_accuracy) on rows "test:{s}", and on
  the shuffled-label rows of the same namespace (the spec with consistent_labels=False);
- the class probe (probes.linear_probe.feature_table) fit on "probe-fit:{s}" and scored on
  "test:{s}", read at the input of the first looped layer (probes.common.loop_span) at visits 0
  and 1;
- the tracked head (probes.computed_recall.tracked_head) chosen on "validation:{s}" and measured
  on "test:{s}", beside every head's masses on the same rows (measure.computed_case.
  answer_head_masses): the head mean over the loop span, and per layer the layer's own head (the
  one the same mean ablation picks within that layer), which the Baseline's side of the
  difference in differences reads.

The arithmetic (the criteria, the verdict, the summaries, the matched-depth difference in
differences, the sign test) is measure.computed_criteria's; this module gathers the figures into
tables and writes them as JSON records and Markdown."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.commands.run_log import train_seconds
from smelt_interp.commands.seed_comparisons import seeds_cell
from smelt_interp.commands.seed_runs import SeedRun
from smelt_interp.measure import computed_criteria as cc
from smelt_interp.measure.case_accuracy import computed_accuracy
from smelt_interp.measure.computed_case import answer_head_masses
from smelt_interp.probes.common import loop_span
from smelt_interp.probes.computed_inputs import heldout_rows, row_length
from smelt_interp.probes.computed_recall import TEST, VALIDATION, tracked_head
from smelt_interp.probes.linear_probe import FIT, feature_table
from smelt_interp.provenance import CKPT_FILE, TASK_COMPUTED, Provenance
from smelt_interp.results import markdown_table, table_block

BASELINE, SMELT, SHALLOW = "baseline", "smelt", "smelt-shallow"  # a seed's runs (its folders)
RUNS = (BASELINE, SMELT, SHALLOW)
STATS = ("bos", "demo")  # BOS and matching-demonstration mass at the answer positions
DASH = "–"
DID_COLUMNS = ("smelt_change", "baseline_change", "did")

MATCHED_DEPTH = (
    "Matched depth: SMELT's (layer L, visit v) runs at depth index d, its position in SMELT's "
    "schedule; the Baseline layer at the same depth index d (the Baseline runs layer d at depth "
    "d) is its match. The difference in differences is (SMELT (L, visit 1) - (L, visit 0)) - "
    "(Baseline layer d1 - Baseline layer d0), d0 and d1 the depths of SMELT's two visits of L, L "
    "the tracked head's layer; – where the Baseline has no layer that deep."
)
DID_KINDS = {
    "tracked": "tracked head (Baseline: each matched layer's own head, the one the same mean "
    "ablation picks within that layer)",
    "mean": "head mean of layer L (Baseline: the head mean of each matched layer)",
}


# ----- measuring one checkpoint ---------------------------------------------------------------
def measure_run(run: SeedRun, role: str, n_rows: int) -> tuple[dict[str, Any], pd.DataFrame]:
    """(the run's figures, its per-(layer, visit) masses: layers_frame) for the final checkpoint
    of `run`, one of a seed's RUNS (`role`), on `n_rows` rows a namespace."""
    seed = run.cfg.seed
    model, info = load_checkpoint(run.folder / CKPT_FILE)
    prov = Provenance.of(info)
    spec = prov.computed_spec
    length = row_length(model, prov.row_len(TASK_COMPUTED))
    rows = {ns: heldout_rows(model, n_rows, length, seed, ns, spec) for ns in (TEST, VALIDATION)}
    rows[FIT] = heldout_rows(model, n_rows, length, seed, FIT, spec)
    shuffled_spec = dataclasses.replace(spec, consistent_labels=False)
    shuffled = heldout_rows(model, n_rows, length, seed, TEST, shuffled_spec)
    accuracy = computed_accuracy(model, rows[TEST], spec)
    shuffled_acc = computed_accuracy(model, shuffled, shuffled_spec)
    probe = feature_table(model, rows[FIT], rows[TEST], spec, seed=seed)
    tracked = tracked_head(model, rows[VALIDATION], rows[TEST], spec)
    heads = answer_head_masses(model, rows[TEST], spec).frame()
    record: dict[str, Any] = {
        "seed": seed,
        "run": role,
        "arch": run.cfg.arch,
        "key": spec.key,
        "row_len": length,
        "n_rows": n_rows,
        "answer_acc": accuracy["answer_accuracy"],
        "query_acc": accuracy["query_accuracy"],
        "n_answer": accuracy["n_answer"],
        "shuffled_acc": shuffled_acc["answer_accuracy"],
        "shuffled_query_acc": shuffled_acc["query_accuracy"],
        "chance": 1 / spec.n_classes,
    }
    record |= probe_figures(probe)
    record |= head_figures(tracked, heads)
    record |= {
        "tokens": int(info.meta.get("tokens", 0)),
        "train_seconds": train_seconds(run.folder, run.cfg),
    }
    layers = layers_frame(heads, tracked["ablation"]).assign(seed=seed, run=role)
    return record, layers


def probe_figures(probe: pd.DataFrame) -> dict[str, Any]:
    """The class probe at the input of the first looped layer (a Baseline: the first layer of
    the span the recipe would loop) at visits 0 and 1 (NaN where there is no visit 1), and at
    the last output."""
    inputs = probe[probe["hook"] == "resid_pre"]
    first = loop_span(inputs)[0]
    out: dict[str, Any] = {"probe_layer": first}
    for visit in (0, 1):
        at = inputs[(inputs["layer"] == first) & (inputs["visit"] == visit)]
        for col in ("accuracy", "control", "majority"):
            value = float(at[col].iloc[0]) if len(at) else math.nan
            out[f"probe_v{visit}_{col.replace('accuracy', 'acc')}"] = value
    last = probe[probe["hook"] == "resid_post"].iloc[-1]
    out |= {"probe_last_acc": float(last["accuracy"]), "probe_last_control": float(last["control"])}
    return out


def head_figures(tracked: Mapping[str, pd.DataFrame], heads: pd.DataFrame) -> dict[str, Any]:
    """The tracked head (layer.head, its ablation on the validation rows, its masses at visits 0
    and 1 on the test rows) and the head mean over the loop span at the same visits."""
    ablation = tracked["ablation"]
    chosen = ablation[ablation["chosen"]].iloc[0]
    masses = tracked["masses"].set_index("visit")
    out: dict[str, Any] = {
        "head": f"layer {int(chosen['layer'])} head {int(chosen['head'])}",
        "head_layer": int(chosen["layer"]),
        "head_ablated_visit": int(chosen["visit"]),
        "head_note": str(chosen["note"]),
        "validation_acc": float(chosen["accuracy_before"]),
        "validation_acc_ablated": float(chosen["accuracy_after"]),
        "bos_uniform": float(tracked["masses"]["bos_mass_uniform"].iloc[0]),
        "demo_uniform": float(tracked["masses"]["demo_mass_uniform"].iloc[0]),
    }
    span = loop_span(heads)
    for visit in (0, 1):
        at = heads[heads["layer"].isin(span) & (heads["visit"] == visit)]
        for stat in STATS:
            has = visit in masses.index
            out[f"{stat}_v{visit}"] = float(masses.loc[visit, f"{stat}_mass"]) if has else math.nan
            out[f"span_{stat}_v{visit}"] = float(at[f"{stat}_mass"].mean()) if len(at) else math.nan
    out["loop_span"] = " ".join(map(str, span))
    return out


def layers_frame(heads: pd.DataFrame, ablation: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, visit) in schedule order: depth, the head mean of BOS and matching-
    demonstration mass (bos_mean, demo_mean), and for a layer whose heads were ablated, its own
    head (the first of the largest drop within the layer, as measure.head_choice chooses over
    all) and that head's masses (bos_head, demo_head; NaN for other layers)."""
    own = {
        int(layer): int(part.loc[part["drop"].idxmax(), "head"])
        for layer, part in ablation.groupby("layer", sort=True)
    }
    rows = []
    for (layer, visit, depth), part in heads.groupby(["layer", "visit", "depth"], sort=False):
        row = {"layer": int(layer), "visit": int(visit), "depth": int(depth)}
        row |= {f"{s}_mean": float(part[f"{s}_mass"].mean()) for s in STATS}
        head = own.get(int(layer))
        at = part[part["head"] == head] if head is not None else part.iloc[:0]
        row["own_head"] = head if head is not None else math.nan
        row |= {f"{s}_head": float(at[f"{s}_mass"].iloc[0]) if len(at) else math.nan for s in STATS}
        rows.append(row)
    return pd.DataFrame(rows).sort_values("depth", ignore_index=True)


# ----- a seed's table ------------------------------------------------------------------------
def did_records(seed: int, layers: pd.DataFrame, tracked_layer: int) -> list[dict[str, Any]]:
    """The seed's difference in differences at the deep-key SMELT's tracked layer, per statistic
    (STATS) and kind (DID_KINDS), from the seed's layers frames (both runs)."""
    smelt = layers[layers["run"] == SMELT]
    base = layers[layers["run"] == BASELINE]
    schedule = [(int(r.layer), int(r.visit)) for r in smelt.itertuples()]
    out = []
    for kind in DID_KINDS:
        suffix = "head" if kind == "tracked" else "mean"
        for stat in STATS:
            col = f"{stat}_{suffix}"
            s = {(int(r.layer), int(r.visit)): float(getattr(r, col)) for r in smelt.itertuples()}
            b = {int(r.layer): float(getattr(r, col)) for r in base.itertuples()}
            rec = cc.matched_depth_did(s, schedule, b, tracked_layer)
            out.append({"seed": seed, "kind": kind, "statistic": stat} | rec)
    return out


def seed_row(records: Mapping[str, Mapping[str, Any]], did: Sequence[Mapping[str, Any]]) -> dict:
    """A seed's row of the per-seed table: the judged values (measure.computed_criteria.JUDGED),
    then what is reported beside them."""
    smelt, shallow, base = records[SMELT], records[SHALLOW], records[BASELINE]
    row: dict[str, Any] = {"seed": smelt["seed"]}
    row |= {col: smelt[col] for col in cc.JUDGED if col in smelt}
    row["shallow_demo_v0"] = shallow["demo_v0"]
    row |= {
        "query_acc": smelt["query_acc"],
        "probe_v1_control": smelt["probe_v1_control"],
        "head": smelt["head"],
        "demo_v0": smelt["demo_v0"],
        "bos_v0_minus_v1": smelt["bos_v0"] - smelt["bos_v1"],
    }
    row |= {f"span_{s}_v{v}": smelt[f"span_{s}_v{v}"] for v in (0, 1) for s in STATS}
    row |= {
        "shallow_answer_acc": shallow["answer_acc"],
        "shallow_head": shallow["head"],
        "shallow_bos_v0": shallow["bos_v0"],
        "shallow_span_demo_v0": shallow["span_demo_v0"],
        "baseline_answer_acc": base["answer_acc"],
        "baseline_shuffled_acc": base["shuffled_acc"],
        "baseline_probe_acc": base["probe_v0_acc"],
        "baseline_head": base["head"],
        "baseline_bos": base["bos_v0"],
        "baseline_demo": base["demo_v0"],
    }
    for rec in did:
        row[f"did_{rec['kind']}_{rec['statistic']}"] = rec["did"]
    return row


# ----- the report ----------------------------------------------------------------------------
# (column, label) of the values table, judged first
VALUE_ROWS = (
    ("answer_acc", "1. deep SMELT answer accuracy"),
    ("shuffled_acc", "1. deep SMELT answer accuracy, shuffled-label rows"),
    ("probe_v0_acc", "2. class probe, first looped layer's input, visit 0"),
    ("probe_v0_control", "2. its shuffled-label control"),
    ("probe_v1_acc", "2. class probe, visit 1"),
    ("bos_v0", "3. tracked head BOS mass, visit 0"),
    ("demo_v1", "3. tracked head matching-demo mass, visit 1"),
    ("bos_v1", "3. tracked head BOS mass, visit 1"),
    ("shallow_demo_v0", "4. shallow SMELT tracked head matching-demo mass, visit 0"),
    ("query_acc", "deep SMELT query accuracy"),
    ("probe_v1_control", "class probe visit 1, its control"),
    ("demo_v0", "tracked head matching-demo mass, visit 0"),
    ("span_bos_v0", "head mean over the loop span, BOS, visit 0"),
    ("span_bos_v1", "head mean over the loop span, BOS, visit 1"),
    ("span_demo_v0", "head mean over the loop span, matching-demo, visit 0"),
    ("span_demo_v1", "head mean over the loop span, matching-demo, visit 1"),
    ("shallow_answer_acc", "shallow SMELT answer accuracy"),
    ("shallow_bos_v0", "shallow SMELT tracked head BOS mass, visit 0"),
    ("shallow_span_demo_v0", "shallow SMELT head mean over the loop span, matching-demo, v0"),
    ("baseline_answer_acc", "Baseline answer accuracy"),
    ("baseline_shuffled_acc", "Baseline answer accuracy, shuffled-label rows"),
    ("baseline_probe_acc", "Baseline class probe, input of the first layer a recipe loops"),
    ("baseline_bos", "Baseline tracked head BOS mass"),
    ("baseline_demo", "Baseline tracked head matching-demo mass"),
    ("did_tracked_bos", "diff-in-diff, BOS, tracked head"),
    ("did_tracked_demo", "diff-in-diff, matching-demo, tracked head"),
    ("did_mean_bos", "diff-in-diff, BOS, head mean"),
    ("did_mean_demo", "diff-in-diff, matching-demo, head mean"),
    ("bos_v0_minus_v1", "tracked head BOS mass, visit 0 - visit 1"),
)


def num(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    return f"{value:.{digits}f}"


def met(flag: Any) -> str:
    return "yes" if bool(flag) else "no"


def criteria_table(judged: pd.DataFrame) -> str:
    """Per seed: every check's value and whether it is met, each criterion, and all four."""
    header = ["seed"]
    for criterion in cc.CRITERIA:
        header += [f"{criterion}: {c.text}" for c in cc.CHECKS if c.criterion == criterion]
        header.append(f"criterion {criterion}")
    header.append("all four")
    values = {
        "c1_accuracy": "answer_acc",
        "c1_shuffled": "shuffled_acc",
        "c2_probe_v1": "probe_v1_acc",
        "c3_bos_v0": "bos_v0",
        "c3_demo_v1": "demo_v1",
        "c3_bos_v1": "bos_v1",
        "c4_shallow_demo_v0": "shallow_demo_v0",
    }
    lines = []
    for r in judged.to_dict("records"):
        line = [str(r["seed"])]
        for criterion, column in zip(cc.CRITERIA, cc.CRITERION_COLUMNS):
            for check in (c for c in cc.CHECKS if c.criterion == criterion):
                if check.column == "c2_probe_v0":
                    shown = f"{num(r['probe_v0_acc'])} (control {num(r['probe_v0_control'])})"
                else:
                    shown = num(r[values[check.column]])
                line.append(f"{shown} {met(r[check.column])}")
            line.append(met(r[column]))
        line.append(f"**{met(r[cc.ALL_MET])}**")
        lines.append(line)
    return table_block("criteria", markdown_table(header, lines))


def values_table(per_seed: pd.DataFrame, summary: pd.DataFrame) -> str:
    """Statistics by seed (VALUE_ROWS), then their median and range over seeds."""
    seeds = per_seed["seed"].tolist()
    by = summary.set_index("statistic")
    lines = []
    for col, label in VALUE_ROWS:
        s = by.loc[col]
        cells = [num(v) for v in per_seed[col].tolist()]
        spread = DASH if s["n"] == 0 else f"{num(s['lowest'])} to {num(s['highest'])}"
        lines.append([label, *cells, num(s["median"]), spread])
    header = ["statistic", *(f"seed {s}" for s in seeds), "median", "range"]
    return markdown_table(header, lines)


def heads_table(records: pd.DataFrame) -> str:
    """Per seed and run: the tracked head's masses beside the head mean over the loop span."""
    header = ["seed", "run", "tracked head", "loop span"]
    header += [f"{s} v{v}: head / span mean" for v in (0, 1) for s in ("BOS", "demo")]
    header += ["validation acc: clean / head ablated", "note"]
    lines = []
    for r in records.to_dict("records"):
        line = [str(r["seed"]), r["run"], r["head"], r["loop_span"]]
        for v in (0, 1):
            for s in STATS:
                line.append(f"{num(r[f'{s}_v{v}'])} / {num(r[f'span_{s}_v{v}'])}")
        line.append(f"{num(r['validation_acc'])} / {num(r['validation_acc_ablated'])}")
        line.append(r["head_note"] or "")
        lines.append(line)
    return markdown_table(header, lines)


def did_table(did: pd.DataFrame) -> str:
    """Per kind and statistic: the depths and every seed's SMELT change, Baseline change and
    difference in differences, each with median and range (commands.seed_comparisons)."""
    header = ["kind", "statistic", "seed: L, d0 -> d1"]
    header += [
        "SMELT visit 1 - visit 0",
        "Baseline layer d1 - layer d0",
        "difference in differences",
    ]
    lines = []
    names = {"bos": "BOS mass", "demo": "matching-demo mass"}
    for (kind, stat), part in did.groupby(["kind", "statistic"], sort=False):
        seeds = part["seed"].tolist()
        where = ", ".join(f"{r.seed}: {r.layer}, {r.d0} -> {r.d1}" for r in part.itertuples())
        cells = [seeds_cell(part[c].astype(float).tolist(), seeds) for c in DID_COLUMNS]
        lines.append([kind, names[stat], where, *cells])
    return markdown_table(header, lines)


def sign_part(test: cc.SignTest, seeds: Sequence[int]) -> str:
    diffs = ", ".join(f"{s}: {num(d)}" for s, d in zip(seeds, test.diffs))
    n = test.positive + test.negative
    return (
        "The test across seeds: the exact two-sided sign test of the tracked head's BOS mass at "
        f"the answer positions, visit 0 - visit 1, per seed ({diffs}): {test.positive} +, "
        f"{test.negative} -, p = {test.p_value:.4f}. With {n} nonzero "
        f"difference{'' if n == 1 else 's'} the smallest p-value possible is {test.floor:.4f} "
        "(2 x 0.5^n: 0.0625 at 5 seeds), so the test can show a consistent direction, not "
        "significance at 0.05."
    )


def report(
    seeds: Sequence[int],
    records: pd.DataFrame,
    layers: pd.DataFrame,
    *,
    n_rows: int,
    validation: bool,
) -> tuple[dict[str, Any], str, cc.Verdict]:
    """(JSON payload, Markdown body, verdict) of the measured runs: `records` one row per seed
    and run (measure_run's figures), `layers` every run's layers frame."""
    rows, did = [], []
    for seed in seeds:
        part = records[records["seed"] == seed]
        by_run = {r["run"]: r for r in part.to_dict("records")}
        seed_did = did_records(seed, layers[layers["seed"] == seed], by_run[SMELT]["head_layer"])
        did += seed_did
        rows.append(seed_row(by_run, seed_did))
    judged = cc.judge(pd.DataFrame(rows))
    did_frame = pd.DataFrame(did)
    summary = cc.summaries(judged, [col for col, _ in VALUE_ROWS])
    test = cc.bos_sign_test(judged)
    outcome = cc.verdict(judged, seeds, n_rows, validation)
    payload = {
        "criteria_file": cc.CRITERIA_FILE,
        "validation_run": validation,
        "verdict": dataclasses.asdict(outcome),
        "thresholds": thresholds(),
        "checks": {c.column: {"criterion": c.criterion, "text": c.text} for c in cc.CHECKS},
        "rows": {
            "n_rows": n_rows,
            "accuracy": f"{TEST}:{{seed}}, held-out split",
            "shuffled_label": f"{TEST}:{{seed}}, the spec with consistent_labels=False",
            "class_probe": f"fit on {FIT}:{{seed}}, scored on {TEST}:{{seed}}",
            "tracked_head": f"chosen on {VALIDATION}:{{seed}}, measured on {TEST}:{{seed}}",
        },
        "matched_depth": MATCHED_DEPTH,
        "did_kinds": DID_KINDS,
        "per_seed": judged.to_dict("records"),
        "over_seeds": summary.to_dict("records"),
        "did": did_frame.to_dict("records"),
        "sign_test": dataclasses.asdict(test),
        "per_run": records.to_dict("records"),
        "layers": layers.to_dict("records"),
    }
    body = markdown(judged, summary, records, did_frame, test, outcome, n_rows, validation)
    return payload, body, outcome


def thresholds() -> dict[str, float]:
    names = (
        "ACCURACY_MIN",
        "SHUFFLED_MAX",
        "PROBE_V0_MAX",
        "PROBE_V0_OVER_CONTROL",
        "PROBE_V1_MIN",
        "BOS_V0_MIN",
        "DEMO_V1_MIN",
        "BOS_V1_MAX",
        "SHALLOW_DEMO_V0_MIN",
        "SEEDS_NEEDED",
        "N_TEST_SEEDS",
        "TEST_ROWS",
    )
    return {name: getattr(cc, name) for name in names}


def markdown(
    judged: pd.DataFrame,
    summary: pd.DataFrame,
    records: pd.DataFrame,
    did: pd.DataFrame,
    test: cc.SignTest,
    outcome: cc.Verdict,
    n_rows: int,
    validation: bool,
) -> str:
    seeds = judged["seed"].tolist()
    lead = []
    if validation:
        lead.append(
            "**Validation run** (seeds the recipe is chosen on): not the study's test; no "
            "verdict is drawn from it."
        )
    lead.append(f"**Verdict.** {outcome.text}")
    lead.append(
        f"The criteria are those pre-registered in {cc.CRITERIA_FILE}; each seed trains the "
        "deep-key Baseline and SMELT and the shallow-key SMELT. Rows: "
        f"{n_rows} a set (pre-registered: {cc.TEST_ROWS}), held-out split, at the run's trained "
        f"row length: accuracy on {TEST}:{{seed}} and on its shuffled-label rows; the class probe "
        f"fit on {FIT}:{{seed}} and scored on {TEST}:{{seed}}; the tracked head chosen on "
        f"{VALIDATION}:{{seed}} (mean ablation at visit 1; the Baseline's at its only visit) and "
        f"measured on {TEST}:{{seed}}."
    )
    parts = [
        *lead,
        "## Criteria per seed",
        "Each check: the seed's value and whether it is met.",
        criteria_table(judged),
        "## Every seed's values, median and range",
        "Judged values first (numbered by criterion), then those reported beside them.",
        values_table(judged, summary),
        "## The tracked head beside the head mean over the loop span",
        "At the answer positions of the test rows; the loop span is the looped layers (a "
        "Baseline: the layers the recipe would loop, at its only visit).",
        heads_table(records),
        "## Difference in differences against the Baseline at matched depth",
        MATCHED_DEPTH,
        "Cells: each seed's value, the median and the range. Kinds: "
        + "; ".join(f"{k}: {v}" for k, v in DID_KINDS.items())
        + ".",
        did_table(did),
        "## Sign test",
        sign_part(test, seeds),
    ]
    return "\n\n".join(parts) + "\n"
