"""The seeds command's tables for a Dyck pair: greedy exact match of each final checkpoint on
one fixed set of held-out words, the test draw by default (data.dyck.heldout_draw: apart from
the validation draw that the trainer and the recipe sweeps choose on), of the preset's Dyck spec
as a task draws it (for `dyck-pair`,
data.dyck.TASK_DYCK: words as real tasks draw them, up to 100 brackets nesting up to 24;
random draws, so the overall figure weights depths as the task does), overall and per
nesting-depth range (data.dyck.DEPTH_BUCKETS) with 95% Wilson intervals; over seeds
(measure.seeds.over_seeds) the mean with a percentile bootstrap interval over seeds (inside
the seeds' range, so never above 100%; "–" under 3 seeds; nominally 95%, it covers far less over
a few seeds, as the table's caption says), the median and the seed spread
(lowest and highest seed); and the rounding check,
seeds trained again with another thread count, beside that spread, with how far a rerun lies
from its own seed against how far two seeds lie apart.

Every checkpoint is scored on the same words, so the spread over seeds is the training seed's
alone, and a rounding run that lands outside it shows the recipe is sensitive to rounding."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from smelt_interp.data.dyck import (
    DEPTH_BUCKETS,
    DyckExample,
    DyckSpec,
    bucket_label,
    build_example,
    depth_bucket,
    make_dataset,
)
from smelt_interp.data.dyck_draws import DRAW_SEED, TEST, VALIDATION, check_draw, heldout_draw
from smelt_interp.measure.dyck_score import complete_many
from smelt_interp.measure.intervals import wilson_interval
from smelt_interp.measure.seeds import over_seeds
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.results import markdown_table, table_block
from smelt_interp.train.assess import accuracy_by_depth

ALL = "all"
# The default pair's target: over seeds, a mean exact match of at least 95% on all depths, and
# no seed below 92%.
TARGET_MEAN, TARGET_FLOOR = 0.95, 0.92
WORDS_SEED = DRAW_SEED  # the held-out words' seed: one set for every checkpoint
DEFAULT_WORDS = 1000
# The ranges the report shows: real tasks' words nest at most 24 deep, so 25+ stays empty.
RANGES = tuple(bucket_label(b) for b in DEPTH_BUCKETS if b[1] is not None)


def heldout_words(
    n: int, spec: DyckSpec, draw: str = TEST, apart_from: int | None = None
) -> list[DyckExample]:
    """`n` held-out completion examples (no demonstrations) of `spec` as a task draws it
    (DyckSpec.task_draw), from the named draw at WORDS_SEED, the same on every call. The test
    draw shares no word with the validation draw's first `apart_from` words (default `n`)."""
    return heldout_draw(draw, n, spec.task_draw(), seed=WORDS_SEED, apart_from=apart_from)


CASE_DEMOS = 2  # the case study's prompts: a query after this many solved words, in context


def in_context_prompts(
    words: Sequence[DyckExample], max_seq_len: int, n_demos: int = CASE_DEMOS
) -> list[DyckExample]:
    """The case study's prompts, as the paper poses in-context Dyck: `words` taken in
    consecutive groups of `n_demos` + 1, the last of each the query and the others solved
    demonstrations before it; a group whose prompt and answer exceed `max_seq_len` tokens is
    left out. Every word is one of `words`, so the prompts share the draw's separation from the
    words a recipe was chosen on."""
    per = n_demos + 1
    prompts = []
    for lo in range(0, len(words) - per + 1, per):
        group = words[lo : lo + per]
        example = build_example(group[-1].query, [w.query for w in group[:-1]])
        if len(example.ids) <= max_seq_len:
            prompts.append(example)
    return prompts


def draw_sentence(draw: str, n: int) -> str:
    """What the report says of the words it scores: which draw, how many, its seed, and how it
    stands to the choice of the recipe."""
    if check_draw(draw) == VALIDATION:
        return (
            f"validation draw: {n:,} words, seed {WORDS_SEED}, the words the recipe was chosen on "
            "(the trainer's periodic evaluation scores its first ones)"
        )
    return (
        f"test draw: {n:,} words, seed {WORDS_SEED}, disjoint from the validation draw used to "
        "choose the recipe"
    )


def depth_counts(words: Sequence[DyckExample]) -> dict[str, int]:
    """How many of `words` nest in each depth range (DEPTH_BUCKETS order; empty ranges left out)."""
    counts = {bucket_label(b): 0 for b in DEPTH_BUCKETS}
    for word in words:
        counts[bucket_label(depth_bucket(word.depth))] += 1
    return {label: n for label, n in counts.items() if n}


def exact_match_rows(model: SmeltModel, words: Sequence[DyckExample]) -> list[dict[str, Any]]:
    """Greedy exact match on `words`: one row for all of them (depth "all") and one per depth
    range that holds a word, each with n, exact_match and its Wilson interval (lo, hi)."""
    answers = complete_many(model, words)
    correct = [answer == word.answer for answer, word in zip(answers, words, strict=True)]
    low, high = wilson_interval(sum(correct), len(correct))
    rows = [{"depth": ALL, "n": len(correct), "exact_match": sum(correct) / len(correct)}]
    rows[0] |= {"lo": low, "hi": high}
    for row in accuracy_by_depth(list(words), correct):
        lo, hi = row["ci95"]
        rows.append({k: row[k] for k in ("depth", "n", "exact_match")} | {"lo": lo, "hi": hi})
    return rows


def summarize(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per (model, depth) of the seed runs (one row per seed, model and depth): the mean exact
    match with its bootstrap interval over seeds (measure.seeds), the median, the lowest and
    highest seed (also as `min` and `max`), and n_seeds."""
    summary = over_seeds(per_seed, ["model", "depth"], ["exact_match"])
    return summary.assign(min=summary["exact_match_min"], max=summary["exact_match_max"])


def targets(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per model: the mean over seeds and the lowest seed on all depths, and whether each meets
    the target (TARGET_MEAN, TARGET_FLOOR)."""
    summary = summarize(per_seed)
    rows = []
    for r in summary[summary["depth"] == ALL].to_dict("records"):
        mean_ok, floor_ok = r["exact_match"] >= TARGET_MEAN, r["min"] >= TARGET_FLOOR
        rows.append(
            {"model": r["model"], "mean": r["exact_match"], "lowest": r["min"]}
            | {"mean_met": bool(mean_ok), "floor_met": bool(floor_ok)}
            | {"met": bool(mean_ok and floor_ok)}
        )
    return pd.DataFrame(rows)


def rounding_check(per_seed: pd.DataFrame, rounding: pd.DataFrame) -> pd.DataFrame:
    """Per (model, depth) of the rounding runs: their exact match beside the same seed's run,
    the seeds' range, and whether it lands inside that range."""
    summary = summarize(per_seed).set_index(["model", "depth"])
    same_seed = per_seed.set_index(["seed", "model", "depth"])["exact_match"]
    rows = []
    for r in rounding.to_dict("records"):
        key = (r["model"], r["depth"])
        low, high = summary.at[key, "min"], summary.at[key, "max"]
        base = float(same_seed[(r["seed"], r["model"], r["depth"])])
        rows.append(
            {
                "model": r["model"],
                "depth": r["depth"],
                "seed": r["seed"],
                "threads": r["threads"],
                "exact_match": r["exact_match"],
                "same_seed": base,
                "difference": r["exact_match"] - base,
                "seeds_min": low,
                "seeds_max": high,
                "within_spread": bool(low <= r["exact_match"] <= high),
            }
        )
    return pd.DataFrame(rows)


def rounding_spread(per_seed: pd.DataFrame, rounding: pd.DataFrame) -> pd.DataFrame:
    """Per model, on all depths: how many rounding reruns land inside the seeds' range, the mean
    gap between a rerun and its own seed, and the mean gap between two different seeds. Alike
    gaps say a change of rounding moves a run as far as a change of seed does."""
    check = rounding_check(per_seed, rounding)
    check = check[check["depth"] == ALL]
    overall = per_seed[per_seed["depth"] == ALL]
    rows = []
    for model, part in check.groupby("model", sort=False):
        seeds = overall[overall["model"] == model]["exact_match"].tolist()
        pairs = [abs(a - b) for i, a in enumerate(seeds) for b in seeds[i + 1 :]]
        rows.append(
            {
                "model": model,
                "reruns": len(part),
                "within_spread": int(part["within_spread"].sum()),
                "rerun_gap": float(part["difference"].abs().mean()),
                "seed_gap": float(sum(pairs) / len(pairs)) if pairs else math.nan,
            }
        )
    return pd.DataFrame(rows)


def _pct(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def _interval(lo: float, hi: float) -> str:
    if lo is None or math.isnan(lo):
        return " [–]"
    return f" [{100 * lo:.1f}, {100 * hi:.1f}]"


def _table(name: str, header: list[str], lines: list[list[str]]) -> str:
    """A README table block (smelt_interp.results) named `name`."""
    return table_block(name, markdown_table(header, lines))


def _cells(frame: pd.DataFrame, model: str, cell: Any) -> list[str]:
    by_depth = {r["depth"]: r for r in frame[frame["model"] == model].to_dict("records")}
    return [cell(by_depth[d]) if d in by_depth else "-" for d in (ALL, *RANGES)]


def _rounding_parts(
    per_seed: pd.DataFrame, rounding: pd.DataFrame, depth_header: list[str]
) -> list[str]:
    """The rounding check: each rerun beside its seed's run, and how far reruns and seeds lie
    from each other."""
    check = rounding_check(per_seed, rounding)
    return [
        "Rounding check: seeds trained again with another thread count (float sums in "
        "another order). Each cell is the rerun's exact match and, in brackets, its "
        "difference in points from the same seed's run; the last column says whether the "
        "rerun lands inside the seeds' range on all depths.",
        _table(
            "rounding",
            ["model", "seed", "threads", *depth_header[1:], "within the seeds' range"],
            [
                [model, str(seed), str(part["threads"].iloc[0])]
                + _cells(part, model, _rerun_cell)
                + ["yes" if bool(part[part["depth"] == ALL]["within_spread"].iloc[0]) else "no"]
                for (model, seed), part in check.groupby(["model", "seed"], sort=True)
            ],
        ),
        "Over the reruns (all depths): how many land inside the seeds' range, and how far a "
        "rerun lies from its own seed beside how far two seeds lie from each other (mean "
        "absolute gaps, in points).",
        _table(
            "rounding-spread",
            ["model", "reruns inside the range", "rerun to its seed", "seed to seed"],
            [
                [r["model"], f"{r['within_spread']} of {r['reruns']}"]
                + [_points(r["rerun_gap"]), _points(r["seed_gap"])]
                for r in rounding_spread(per_seed, rounding).to_dict("records")
            ],
        ),
    ]


def markdown(
    per_seed: pd.DataFrame,
    runs: pd.DataFrame,
    rounding: pd.DataFrame | None,
    models: Sequence[str],
    spec: DyckSpec,
    training: DyckSpec,
    draw: str = TEST,
) -> str:
    """The report: the by-depth table over seeds (mean [95% bootstrap over seeds]; median;
    lowest-highest seed), each seed's figures with Wilson intervals, the rounding check and the
    training times. `spec` is the held-out words' spec, `draw` the draw they came from
    (data.dyck.DRAWS), `training` the spec the runs drew their words from."""
    n_words = int(per_seed[per_seed["depth"] == ALL]["n"].iloc[0])
    summary = summarize(per_seed)
    depth_header = ["model", "all depths", *(f"depth {r}" for r in RANGES)]

    def over(r: Mapping[str, Any]) -> str:
        mean = _pct(r["exact_match"]) + _interval(r["exact_match_lo"], r["exact_match_hi"])
        return f"{mean}; {_pct(r['exact_match_median'])}; {_pct(r['min'])}-{_pct(r['max'])}"

    def one(r: Mapping[str, Any]) -> str:
        return _pct(r["exact_match"]) + _interval(r["lo"], r["hi"])

    parts = [
        f"Greedy exact match on {n_words:,} held-out "
        f"Dyck-{spec.n_pairs} words of {spec.min_len}-{spec.max_len} brackets nesting up to "
        f"{spec.max_depth} deep (random draws; {draw_sentence(draw, n_words)}; the same words "
        "for every checkpoint). Over seeds: mean [percentile bootstrap over seeds, nominal 95%; "
        "– under 3 seeds: over 3 seeds it covers the mean about 73% of the time and over 5 about "
        "85% (simulated, measure.seed_stats)]; median; lowest-highest seed.",
        _table("by-depth", depth_header, [[m, *_cells(summary, m, over)] for m in models]),
        _words_line(per_seed),
        training_words_line(training, n_words),
        "Per seed: exact match [95% Wilson interval over words].",
        _table(
            "seeds",
            ["seed", *depth_header],
            [
                [str(seed), m, *_cells(part, m, one)]
                for seed, part in per_seed.groupby("seed", sort=True)
                for m in models
            ],
        ),
        "Target: a mean of at least "
        f"{_pct(TARGET_MEAN)} over seeds on all depths, and no seed below {_pct(TARGET_FLOOR)}.",
        _table(
            "targets",
            ["model", "mean over seeds", "lowest seed", "mean met", "floor met", "target met"],
            [
                [r["model"], _pct(r["mean"]), _pct(r["lowest"])]
                + ["yes" if r[k] else "no" for k in ("mean_met", "floor_met", "met")]
                for r in targets(per_seed).to_dict("records")
            ],
        ),
        _time_table(runs, models),
    ]
    if rounding is not None and len(rounding):
        parts += _rounding_parts(per_seed, rounding, depth_header)
    return "\n\n".join(parts) + "\n"


def _rerun_cell(r: Mapping[str, Any]) -> str:
    return f"{_pct(r['exact_match'])} ({100 * r['difference']:+.1f})"


def _points(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f}"


def _words_line(per_seed: pd.DataFrame) -> str:
    """How many of the words fall in each depth range (the same words for every run)."""
    first = per_seed[per_seed["seed"] == per_seed["seed"].min()].drop_duplicates("depth")
    counts = {r["depth"]: int(r["n"]) for r in first.to_dict("records")}
    total = counts.pop(ALL)
    return f"Words by nesting depth, of {total:,}: {_mix(counts, total)}."


def training_words_line(training: DyckSpec, n: int) -> str:
    """The same count for `n` words of the runs' own training spec, which may draw deeper (or
    shallower) words than the task poses (`p_open` above or below DyckSpec.task_draw's)."""
    words = make_dataset(n, spec=training, split="train", seed=WORDS_SEED)
    task = training.task_draw().p_open
    if training.p_open == task:
        how = "as the task draws them"
    else:
        how = "deeper than the task" if training.p_open > task else "shallower than the task"
    return (
        f"The runs' training words (p_open {training.p_open:g}, {how}), of {n:,} drawn the same "
        f"way: {_mix(depth_counts(words), n)}."
    )


def _mix(counts: Mapping[str, int], total: int) -> str:
    return ", ".join(f"{depth}: {n:,} ({100 * n / total:.1f}%)" for depth, n in counts.items())


def _time_table(runs: pd.DataFrame, models: Sequence[str]) -> str:
    """Training time per model: seconds of optimizer steps, mean and range over the seed runs,
    and tokens."""
    lines = []
    for m in models:
        part = runs[(runs["model"] == m) & (runs["role"] == "seed")]
        secs = part["train_seconds"]
        lines.append(
            [m, f"{secs.mean():,.0f}", f"{secs.min():,.0f}-{secs.max():,.0f}"]
            + [f"{part['tokens'].iloc[0]:,.0f}", str(int(part["threads"].iloc[0]))]
        )
    header = ["model", "train s, mean", "train s, range", "tokens", "CPU threads (not the device)"]
    intro = "Training time (seconds of optimizer steps; evaluation and saving left out):"
    return intro + "\n\n" + _table("time", header, lines)
