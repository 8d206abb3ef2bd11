"""The seeds command's tables for a recall pair, from one checkpoint's case-study tables and head
ablation: per (layer, visit) the BOS mass at non-answer positions and the demonstration-answer mass
at answer positions, for the best head and as the mean over heads; per model the answer accuracy,
Sink^0.3, the ablation results and whether each target of the case study is met. Then the mean over
seeds with a t interval (measure.seeds) and the Markdown tables of both.

Answer positions are every query with an earlier occurrence of its trigger; the probe reports
them per demonstration count (n_demos >= 1), so the figure for all of them is the mean over
counts weighted by how many positions each count has (the accuracy table's `n`), and its
interval the same weighted mean of the counts' bootstrap intervals (wider than a bootstrap of
the pooled mean would give, never narrower than the widest count's share)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from smelt_interp.measure.seeds import over_seeds

# The case study's targets (held-out rows): a sink grown by training, and retrieval.
SINK_BOS, SINK03 = 0.5, 0.25
RETRIEVAL_ACC, RETRIEVAL_DEMO = 0.90, 0.5
SUFFIXES = ("", "_lo", "_hi")
VISIT_STATS = ("bos_best", "bos_mean", "demo_best", "demo_mean")
MODEL_STATS = (
    "answer_acc",
    "first_acc",
    "sink03_64",
    "acc_clean",
    "acc_retrieval_ablated",
    "acc_retrieval_heads_ablated",
    "loss_clean",
    "loss_parked_ablated",
    "tokens",
    "train_seconds",
)
TARGETS = ("sink_target", "retrieval_target", "both_in_one_head")


def _weighted(frame: pd.DataFrame, keys: list[str], cols: list[str], weight: str) -> pd.DataFrame:
    """Per `keys` group, the `weight`-weighted mean of each of `cols`."""
    w = frame[weight].astype(float)
    summed = frame[cols].mul(w, axis=0).assign(**{k: frame[k] for k in keys}, _w=w)
    out = summed.groupby(keys, as_index=False, sort=False).sum(numeric_only=True)
    out[cols] = out[cols].div(out["_w"], axis=0)
    return out.drop(columns="_w")


def answer_heads(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Per (layer, visit, head): demo_mass (+_lo/_hi) at all answer positions, and bos_mass
    (+_lo/_hi) at non-answer positions."""
    heads, acc = tables["heads"], tables["accuracy"]
    counts = acc[acc["kind"] == "next_token"][["n_demos", "n"]]
    answer = heads[heads["n_demos"] >= 1].merge(counts, on="n_demos")
    demo = [f"demo_mass{s}" for s in SUFFIXES]
    pooled = _weighted(answer, ["layer", "visit", "head"], demo, "n")
    non = tables["non_answer"][["layer", "visit", "head", *(f"bos_mass{s}" for s in SUFFIXES)]]
    return pooled.merge(non, on=["layer", "visit", "head"])


def visit_figures(heads: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, visit) of answer_heads: the best head's masses (and which head) and the mean
    over heads, each with the probe's interval."""
    rows = []
    for (layer, visit), part in heads.groupby(["layer", "visit"], sort=False):
        row: dict[str, Any] = {"layer": layer, "visit": visit}
        for name, col in (("bos", "bos_mass"), ("demo", "demo_mass")):
            best = part.loc[part[col].idxmax()]
            row[f"{name}_best_head"] = int(best["head"])
            for s in SUFFIXES:
                row[f"{name}_best{s}"] = float(best[f"{col}{s}"])
                row[f"{name}_mean{s}"] = float(part[f"{col}{s}"].mean())
        rows.append(row)
    return pd.DataFrame(rows)


def model_figures(
    tables: Mapping[str, pd.DataFrame], heads: pd.DataFrame, ablation: pd.DataFrame
) -> dict[str, Any]:
    """Answer accuracy (all answer positions, and first occurrences), Sink^0.3, the head
    ablation's results and the targets met, for one checkpoint."""
    acc = tables["accuracy"]
    acc = acc[acc["kind"] == "next_token"]
    later = _weighted(
        acc[acc["n_demos"] >= 1].assign(all=0), ["all"], ["accuracy", "lo", "hi"], "n"
    )
    first = acc[acc["n_demos"] == 0]["accuracy"]
    runs = ablation.set_index("run")
    retrieval, parked = runs.loc["retrieval head ablated"], runs.loc["parked head ablated"]
    team = runs.loc["retrieval heads ablated"]
    sink03 = float(tables["sink"]["sink03_64"].iloc[0])
    out: dict[str, Any] = {
        "answer_acc": float(later["accuracy"].iloc[0]),
        "answer_acc_lo": float(later["lo"].iloc[0]),
        "answer_acc_hi": float(later["hi"].iloc[0]),
        "first_acc": float(first.iloc[0]) if len(first) else math.nan,
        "sink03_64": sink03,
        "retrieval_head": _head(retrieval),
        "parked_head": _head(parked),
        "acc_clean": float(runs.loc["clean", "answer_acc"]),
        "acc_retrieval_ablated": float(retrieval["answer_acc"]),
        "acc_retrieval_heads_ablated": float(team["answer_acc"]),
        "retrieval_heads": str(team["heads"]),
        "loss_clean": float(runs.loc["clean", "non_answer_loss"]),
        "loss_parked_ablated": float(parked["non_answer_loss"]),
        "chance": float(runs.loc["clean", "chance"]),
    }
    sink = heads["bos_mass"].max() >= SINK_BOS and sink03 >= SINK03
    found = heads["demo_mass"].max() >= RETRIEVAL_DEMO and out["answer_acc"] >= RETRIEVAL_ACC
    one = ((heads["bos_mass"] >= SINK_BOS) & (heads["demo_mass"] >= RETRIEVAL_DEMO)).any()
    out |= {"sink_target": bool(sink), "retrieval_target": bool(found)}
    out["both_in_one_head"] = bool(sink and found and one)
    return out


def _head(row: pd.Series) -> str:
    return f"{int(row['layer'])}.{int(row['visit'])}.{int(row['head'])}"


def visit_differences(visits: pd.DataFrame) -> pd.DataFrame:
    """Per seed, model and looped layer (a layer with a visit 1): visit 1 minus visit 0 of each
    VISIT_STATS figure, paired within the seed."""
    rows = []
    for (seed, model, layer), part in visits.groupby(["seed", "model", "layer"], sort=False):
        by_visit = part.set_index("visit")
        if 1 not in by_visit.index:
            continue
        row = {"seed": seed, "model": model, "layer": layer}
        row |= {c: by_visit.at[1, c] - by_visit.at[0, c] for c in VISIT_STATS}
        rows.append(row)
    return pd.DataFrame(rows, columns=["seed", "model", "layer", *VISIT_STATS])


def summarize(visits: pd.DataFrame, models: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The per-seed tables (one row per seed and model, or seed, model, layer and visit) over
    seeds: means with t intervals, visit 1 - visit 0 of the looped layers (paired within each
    seed, t intervals over seeds), and per model how many seeds meet each target."""
    by_visit = over_seeds(visits, ["model", "layer", "visit"], VISIT_STATS)
    diffs = visit_differences(visits)
    by_diff = over_seeds(diffs, ["model", "layer"], VISIT_STATS) if len(diffs) else diffs
    by_model = over_seeds(models, ["model"], MODEL_STATS)
    counts = models.groupby("model", sort=False)[list(TARGETS)].sum().astype(int)
    return {
        "by_visit": by_visit,
        "visit_diff": by_diff,
        "by_model": by_model.merge(counts.reset_index(), on="model"),
    }


def _cell(row: Mapping[str, Any], col: str, digits: int = 3) -> str:
    value, lo, hi = (row.get(f"{col}{s}", math.nan) for s in SUFFIXES)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if lo is None or (isinstance(lo, float) and math.isnan(lo)):
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _table(header: list[str], lines: list[list[str]]) -> str:
    rows = [header, ["---"] * len(header), *lines]
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def markdown(
    summary: Mapping[str, pd.DataFrame], visits: pd.DataFrame, models: pd.DataFrame
) -> str:
    """The seeds command's report (below its title and header lines): over seeds (mean [95% t
    interval]), then per seed (value [95% bootstrap interval over rows])."""
    n = int(summary["by_model"]["n_seeds"].max())
    mass_header = ["model", "layer.visit", "BOS mass, best head", "BOS mass, head mean"]
    mass_header += ["demo mass, best head", "demo mass, head mean"]
    model_header = ["model", "answer acc", "first-occurrence acc", "Sink^0.3", "acc clean"]
    model_header += ["acc, retrieval head ablated", "acc, all retrieval heads ablated"]
    model_header += ["non-answer loss clean"]
    model_header += ["loss, parked head ablated", "tokens", "train s"]
    parts = [
        f"Over {n} seeds: mean [95% Student-t interval over seeds]. BOS mass at non-answer "
        "positions, demonstration-answer (demo) mass at answer positions (held-out rows).",
        _table(mass_header, [_mass_line(r) for r in summary["by_visit"].to_dict("records")]),
        "Visit 1 - visit 0 of the looped layers, paired within each seed: mean [95% t interval "
        "over seeds].",
        _table(
            ["model", "layer", *mass_header[2:]],
            [
                [r["model"], str(r["layer"]), *(_cell(r, c) for c in VISIT_STATS)]
                for r in summary["visit_diff"].to_dict("records")
            ],
        ),
        _table(model_header, [_model_line(r) for r in summary["by_model"].to_dict("records")]),
        f"Seeds meeting each target, of {n}:",
        _table(
            ["model", "sink (BOS >= 0.5, Sink^0.3 >= 0.25)", "retrieval (acc >= 0.9, demo >= 0.5)"]
            + ["both in one head"],
            [
                [r["model"], *(str(int(r[t])) for t in TARGETS)]
                for r in summary["by_model"].to_dict("records")
            ],
        ),
        "Per seed: value [95% bootstrap interval over rows].",
        _table(["seed", *mass_header], [[str(r["seed"]), *_mass_line(r)] for r in _recs(visits)]),
        _table(
            ["seed", *model_header, "retrieval head", "parked head", "retrieval heads", "chance"],
            [
                [str(r["seed"]), *_model_line(r), r["retrieval_head"], r["parked_head"]]
                + [r["retrieval_heads"]]
                + [f"{r['chance']:.3f}"]
                for r in _recs(models)
            ],
        ),
    ]
    return "\n\n".join(parts) + "\n"


def _recs(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return frame.to_dict("records")


def _mass_line(r: Mapping[str, Any]) -> list[str]:
    return [r["model"], f"{r['layer']}.{r['visit']}", *(_cell(r, c) for c in VISIT_STATS)]


def _model_line(r: Mapping[str, Any]) -> list[str]:
    cells = [_cell(r, c) for c in MODEL_STATS[:-2]]
    return [r["model"], *cells, f"{r['tokens']:,.0f}", f"{r['train_seconds']:,.0f}"]
