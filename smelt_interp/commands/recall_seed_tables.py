"""The seeds command's tables for a recall pair: the case-study tables of every checkpoint on
held-out rows and on control rows (commands.case_seed_tables: answer-position BOS and
demonstration mass first, head means and best heads beside chance, same-head visit pairs, the
non-answer split), and per model the answer accuracy, Sink^0.3, the head ablation's results and
whether each target of the case study is met; over seeds with measure.seeds.over_seeds (mean,
median, range, seeds above 0.3 and 0.5, a bootstrap interval over seeds from 3 seeds on), and
the Markdown of all of them.

The head ablation chooses its heads from `answer_heads`: per head, the demonstration mass at
every answer position (a query with an earlier occurrence of its trigger; the probe reports them
per demonstration count, so this pools the counts weighted by their positions, the accuracy
table's `n`) and the BOS mass at non-answer positions."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from smelt_interp.commands import case_seed_tables as case_tables
from smelt_interp.measure.seeds import over_seeds
from smelt_interp.measure.sink import HOLD_EVALS, SINK_BOS
from smelt_interp.measure.sink_gu import GU_KEY, GU_NAME

POOLED_SINK03 = "pooled Sink^0.3"

# The case study's targets (held-out rows): a sink grown by training (SINK_BOS, the sink
# definition, and Sink^0.3 at least SINK03), and retrieval.
SINK03 = 0.25
RETRIEVAL_ACC, RETRIEVAL_DEMO = 0.90, 0.5
SUFFIXES = ("", "_lo", "_hi")
MODEL_STATS = (
    "answer_acc",
    "first_acc",
    "sink03",  # Gu et al.'s sink03_gu, or the pooled sink03_64 of results measured before it
    "held_bos",
    "acc_clean",
    "acc_retrieval_ablated",
    "acc_retrieval_heads_ablated",
    "loss_clean",
    "loss_parked_ablated",
    "tokens",
    "train_seconds",
)
TARGETS = ("sink_target", "sink_held", "retrieval_target", "both_in_one_head")


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


def model_figures(
    tables: Mapping[str, pd.DataFrame],
    heads: pd.DataFrame,
    ablation: pd.DataFrame,
    held: tuple[str, float] = ("none", math.nan),
) -> dict[str, Any]:
    """Answer accuracy (all answer positions, and first occurrences), Sink^0.3, the head
    ablation's results and the targets met, for one checkpoint; `held` is the run's
    (head, mass) of non-answer BOS held over its last evaluations (commands.run_log.held_sink),
    the sink that stays through training rather than the final checkpoint's alone."""
    acc = tables["accuracy"]
    acc = acc[acc["kind"] == "next_token"]
    later = _weighted(
        acc[acc["n_demos"] >= 1].assign(all=0), ["all"], ["accuracy", "lo", "hi"], "n"
    )
    first = acc[acc["n_demos"] == 0]["accuracy"]
    runs = ablation.set_index("run")
    retrieval, parked = runs.loc["retrieval head ablated"], runs.loc["parked head ablated"]
    # no head meets the sink definition: the parked run ablated nothing (NaN figures)
    team = runs.loc["retrieval heads ablated"]
    pooled = float(tables["sink"]["sink03_64"].iloc[0])
    sink03 = float(tables["sink"][GU_KEY].iloc[0])
    out: dict[str, Any] = {
        "answer_acc": float(later["accuracy"].iloc[0]),
        "answer_acc_lo": float(later["lo"].iloc[0]),
        "answer_acc_hi": float(later["hi"].iloc[0]),
        "first_acc": float(first.iloc[0]) if len(first) else math.nan,
        GU_KEY: sink03,
        "sink03_64": pooled,
        "held_bos": held[1],
        "held_head": held[0],
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
    out |= {
        "sink_target": bool(sink),
        "sink_held": bool(held[1] >= SINK_BOS),  # NaN (too few evaluations) is not met
        "retrieval_target": bool(found),
    }
    out["both_in_one_head"] = bool(sink and found and one)
    return out


def _head(row: pd.Series) -> str:
    """layer.visit.head of an ablation run, or "none" when it ablated nothing."""
    if pd.isna(row.get("layer")):
        return "none"
    return f"{int(row['layer'])}.{int(row['visit'])}.{int(row['head'])}"


def sink_stat(models: pd.DataFrame) -> tuple[str, str]:
    """(column, name) of the models' Sink^0.3: Gu et al.'s where the results carry it, else the
    pooled figure that results measured before it carry, named as such."""
    if GU_KEY in models and models[GU_KEY].notna().any():
        return GU_KEY, GU_NAME
    return "sink03_64", POOLED_SINK03


def model_stats(models: pd.DataFrame) -> tuple[str, ...]:
    """MODEL_STATS with the models' Sink^0.3 column (sink_stat) in its place."""
    column = sink_stat(models)[0]
    return tuple(column if s == "sink03" else s for s in MODEL_STATS)


def summarize(per_seed: Mapping[str, pd.DataFrame], models: pd.DataFrame) -> dict[str, Any]:
    """Over seeds: the case-study frames (case_seed_tables.summarize), the per-model figures,
    and per model how many seeds meet each target."""
    summary: dict[str, Any] = case_tables.summarize(per_seed)
    by_model = over_seeds(models, ["model"], model_stats(models))
    counts = models.groupby("model", sort=False)[list(TARGETS)].sum().astype(int)
    summary["by_model"] = by_model.merge(counts.reset_index(), on="model")
    return summary


def _table(header: list[str], lines: list[list[str]]) -> str:
    return case_tables.table(header, lines)


def markdown(
    summary: Mapping[str, pd.DataFrame],
    per_seed: Mapping[str, pd.DataFrame],
    models: pd.DataFrame,
) -> str:
    """The seeds command's report (below its title and header lines): the case-study tables over
    seeds, the model figures and targets, then per seed (value [95% bootstrap interval over
    rows])."""
    n = int(summary["by_model"]["n_seeds"].max())
    stats, sink_name = model_stats(models), sink_stat(models)[1]
    model_header = ["model", "answer acc", "first-occurrence acc", sink_name]
    model_header += [f"non-answer BOS held (lowest of the last {HOLD_EVALS} evals)", "acc clean"]
    model_header += ["acc, retrieval head ablated", "acc, all retrieval heads ablated"]
    model_header += ["non-answer loss clean"]
    model_header += ["loss, parked head ablated", "tokens", "train s"]
    parts = case_tables.over_seed_parts(summary, per_seed, "held-out rows")
    parts += [
        "Per model: mean; median; lowest to highest seed (every seed in the per-seed table "
        "below). The parked head is a head that meets the sink definition (BOS "
        f"mass at non-answer positions >= {SINK_BOS:g}); where no head does, nothing is ablated "
        "and its loss reads –.",
        case_tables.named_table(
            "models",
            model_header,
            [_model_line(r, stats, over=True) for r in _recs(summary["by_model"])],
        ),
        f"Seeds meeting each target, of {n}:",
        case_tables.named_table(
            "targets",
            [
                "model",
                f"sink (BOS >= {SINK_BOS:g}, {sink_name} >= {SINK03:g})",
                f"sink held (BOS >= {SINK_BOS:g} over the last {HOLD_EVALS} evals)",
                f"retrieval (acc >= {RETRIEVAL_ACC:g}, demo >= {RETRIEVAL_DEMO:g})",
                "both in one head",
            ],
            [
                [r["model"], *(str(int(r[t])) for t in TARGETS)]
                for r in summary["by_model"].to_dict("records")
            ],
        ),
        "Per seed: value [95% bootstrap interval over rows]; the best head's index in brackets.",
        case_tables.per_seed_part(per_seed["visits"]),
        _table(
            ["seed", *model_header, "held head", "retrieval head", "parked head"]
            + ["retrieval heads", "chance"],
            [
                [str(r["seed"]), *_model_line(r, stats), r["held_head"]]
                + [r["retrieval_head"], r["parked_head"]]
                + [r["retrieval_heads"]]
                + [f"{r['chance']:.3f}"]
                for r in _recs(models)
            ],
        ),
    ]
    return "\n\n".join(parts) + "\n"


def _recs(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return frame.to_dict("records")


def _model_line(r: Mapping[str, Any], stats: Sequence[str], over: bool = False) -> list[str]:
    """A model's figures (`stats`, model_stats): over seeds (summary cells, no threshold
    counts) or of one seed."""
    cells = [
        case_tables.mass_cell(r, c, counts=False) if over else case_tables.seed_cell(r, c)
        for c in stats[:-2]
    ]
    return [r["model"], *cells, f"{r['tokens']:,.0f}", f"{r['train_seconds']:,.0f}"]
