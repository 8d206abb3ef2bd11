"""The Dyck case study: on in-context Dyck prompts (0..k demonstrations), the attention mass
from the answer positions onto BOS and onto the demonstrations' answer tokens, per (layer,
visit, head) and averaged over heads, plus the model's exact-match accuracy; the sink's trend
with effective depth and, at each looped layer, visit 1 against visit 0.

Answer positions are the queries that predict the answer's tokens: from the one before its
first token through the one before its last (see data.dyck_eval.answer_positions). Masses are
means over those positions of all examples with the same number of demonstrations. Every
statistic carries a 95% percentile bootstrap interval over prompts (1,000 resamples of the
prompts with replacement, seeded; columns *_lo/*_hi or lo/hi).

    python -m smelt_interp.probes.dyck ckpt.pt [--demos 0,1,2,4] [--n-seqs N] [--compare OTHER]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from smelt_interp import paper
from smelt_interp.data.dyck import DyckExample, dyck_batch
from smelt_interp.data.dyck_eval import answer_positions, answer_scores, exact_match_accuracy
from smelt_interp.errors import DataError
from smelt_interp.model.transformer import SmeltModel, hook_name
from smelt_interp.probes import registry
from smelt_interp.probes.attention_stats import DEFAULT_CHUNK, key_set_mass
from smelt_interp.probes.common import (
    DEFAULT_BATCH,
    capture,
    loop_span,
    make_batch,
    micro_batches,
    visit_names,
)
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.metrics import span_mask
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary


def _by_demos(examples: Sequence[DyckExample]) -> dict[int, list[DyckExample]]:
    if not examples:
        raise DataError("the Dyck probe needs at least one example")
    groups: dict[int, list[DyckExample]] = defaultdict(list)
    for ex in examples:
        groups[ex.n_demos].append(ex)
    return dict(sorted(groups.items()))


N_RESAMPLES = 1000
LEVEL = 0.95
STATS = ("bos_mass", "demo_mass")


@dataclass(frozen=True)
class PromptMasses:
    """The prompts with one demonstration count: per prompt, the attention mass summed over its
    answer positions, sums [n, visits (schedule order), heads, 2 (BOS, demonstration answers)],
    and how many answer positions it has, counts [n]."""

    sums: np.ndarray
    counts: np.ndarray


def prompt_masses(
    model: SmeltModel,
    examples: Sequence[DyckExample],
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
) -> dict[int, PromptMasses]:
    """{n_demos: PromptMasses} over the examples with that many demonstrations."""
    names = visit_names(model, model.schedule, "attn.hook_q", "attn.hook_k")
    out = {}
    for n_demos, group in _by_demos(examples).items():
        batch = make_batch(model, *dyck_batch(group))
        device, width = batch.tokens.device, batch.tokens.shape[1]
        q_pos, q_valid = answer_positions([ex.answer_span for ex in group], device)
        key_sets = torch.stack(
            [
                span_mask([[(0, 1)]] * len(group), width, device),
                span_mask([ex.demo_answer_spans for ex in group], width, device),
            ],
            dim=1,
        )
        sums = []
        for mb in micro_batches(batch, batch_size, f"dyck ({n_demos} demos)"):
            _, cache = capture(model, mb.tokens, names)
            pos, keep = q_pos[mb.rows], q_valid[mb.rows]
            sets = key_sets[mb.rows, :, : mb.tokens.shape[1]]
            per_visit = [
                key_set_mass(*_qk(cache, layer, visit), pos, keep, sets, chunk)
                for layer, visit in model.schedule
            ]
            sums.append(torch.stack(per_visit, dim=1).cpu().numpy())  # [b, visits, H, 2]
        out[n_demos] = PromptMasses(np.concatenate(sums), q_valid.sum(dim=1).cpu().double().numpy())
    return out


def _qk(cache: dict[str, torch.Tensor], layer: int, visit: int) -> list[torch.Tensor]:
    return [cache[hook_name(layer, visit, f"attn.hook_{x}")] for x in "qk"]


def resample_weights(n: int, n_resamples: int = N_RESAMPLES, seed: int = 0) -> np.ndarray:
    """[n_resamples, n]: how often each of n prompts is drawn in each bootstrap resample
    (n draws with replacement), seeded."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_resamples).astype(np.float64)


def pooled(sums: np.ndarray, counts: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, ...]:
    """Pooled means sums.sum(0) / counts.sum() ([n, ...] -> [...]) and, per bootstrap resample
    (rows of `weights`), the same pooled mean of the resampled prompts: (point, boot)."""
    flat = sums.reshape(sums.shape[0], -1)
    point = flat.sum(axis=0) / counts.sum()
    boot = (weights @ flat) / (weights @ counts)[:, None]
    return point.reshape(sums.shape[1:]), boot.reshape((-1, *sums.shape[1:]))


def interval(boot: np.ndarray, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval over the resamples (axis 0)."""
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(boot, [tail, 100 - tail], axis=0)
    return lo, hi


def case_study(
    masses: dict[int, PromptMasses],
    schedule: Sequence[tuple[int, int]],
    *,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> Tables:
    """The case study's tables, each statistic with a percentile bootstrap interval over prompts
    (columns *_lo, *_hi): `heads` (n_demos, layer, visit, depth, head, bos_mass, demo_mass),
    `visits` (the same averaged over heads), `trend` (per n_demos and statistic, the slope of
    the head-mean mass against effective depth, least squares) and `visit_diff` (per n_demos,
    looped layer and statistic: visit 1 minus visit 0)."""
    depth = np.arange(len(schedule), dtype=np.float64)
    centred = (depth - depth.mean()) / max(float(((depth - depth.mean()) ** 2).sum()), 1e-12)
    index = {lv: i for i, lv in enumerate(schedule)}
    looped = sorted({layer for layer, visit in schedule if visit == 1})
    heads, visits, trend, diffs = [], [], [], []
    for n_demos, m in masses.items():
        weights = resample_weights(len(m.counts), n_resamples, seed + n_demos)
        point, boot = pooled(m.sums, m.counts, weights)  # [P, H, 2], [R, P, H, 2]
        lo, hi = interval(boot, level)
        v_point, v_boot = point.mean(axis=1), boot.mean(axis=2)  # [P, 2], [R, P, 2]
        v_lo, v_hi = interval(v_boot, level)
        for i, (layer, visit) in enumerate(schedule):
            key = {"n_demos": n_demos, "layer": layer, "visit": visit, "depth": i}
            for head in range(point.shape[1]):
                heads.append(key | {"head": head} | _cols(point, lo, hi, (i, head)))
            visits.append(key | _cols(v_point, v_lo, v_hi, (i,)))
        for s, stat in enumerate(STATS):
            t_lo, t_hi = interval(v_boot[..., s] @ centred, level)
            slope = float(v_point[:, s] @ centred)
            trend.append(
                {"n_demos": n_demos, "statistic": stat, "slope": slope, "lo": t_lo, "hi": t_hi}
            )
            for layer in looped:
                a, b = index[layer, 0], index[layer, 1]
                d_lo, d_hi = interval(v_boot[:, b, s] - v_boot[:, a, s], level)
                diffs.append(
                    {
                        "n_demos": n_demos,
                        "layer": layer,
                        "statistic": stat,
                        "visit_0": v_point[a, s],
                        "visit_1": v_point[b, s],
                        "diff": v_point[b, s] - v_point[a, s],
                        "lo": d_lo,
                        "hi": d_hi,
                    }
                )
    diff_cols = ["n_demos", "layer", "statistic", "visit_0", "visit_1", "diff", "lo", "hi"]
    return {
        "heads": pd.DataFrame(heads),
        "visits": pd.DataFrame(visits),
        "trend": pd.DataFrame(trend),
        "visit_diff": pd.DataFrame(diffs, columns=diff_cols),
    }


def _cols(point: np.ndarray, lo: np.ndarray, hi: np.ndarray, at: tuple[int, ...]) -> dict:
    """{stat: value, stat_lo: ..., stat_hi: ...} for both statistics at index `at`."""
    out = {}
    for s, stat in enumerate(STATS):
        out |= {stat: point[(*at, s)], f"{stat}_lo": lo[(*at, s)], f"{stat}_hi": hi[(*at, s)]}
    return out


def measure(
    model: SmeltModel,
    examples: Sequence[DyckExample],
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
) -> pd.DataFrame:
    """Columns: n_demos, layer, visit, depth, head, bos_mass, demo_mass (0 without demos),
    each mass with its bootstrap interval over prompts (bos_mass_lo, bos_mass_hi, ...)."""
    masses = prompt_masses(model, examples, batch_size=batch_size, chunk=chunk)
    return case_study(masses, model.schedule)["heads"]


def by_visit(heads: pd.DataFrame) -> pd.DataFrame:
    """Mean over heads per (n_demos, layer, visit) (point values; case_study's `visits` table
    has intervals too)."""
    return (
        heads.groupby(["n_demos", "layer", "visit", "depth"], as_index=False)
        .agg(bos_mass=("bos_mass", "mean"), demo_mass=("demo_mass", "mean"))
        .sort_values(["n_demos", "depth"], ignore_index=True)
    )


def with_demos(visits: pd.DataFrame) -> pd.DataFrame:
    """The rows of prompts with demonstrations (all rows when no prompt has any): where the
    answer can attend to demonstration answers."""
    return visits[visits["n_demos"] > 0] if (visits["n_demos"] > 0).any() else visits


def answer_mass(visits: pd.DataFrame) -> pd.DataFrame:
    """by_visit rows averaged over the prompts `with_demos`: one row per (layer, visit), as
    figures.dyck draws them."""
    return (
        with_demos(visits)
        .groupby(["layer", "visit", "depth"], as_index=False)[["bos_mass", "demo_mass"]]
        .mean()
        .sort_values("depth", ignore_index=True)
    )


def accuracy(
    model: SmeltModel, examples: Sequence[DyckExample], *, batch_size: int = DEFAULT_BATCH
) -> pd.DataFrame:
    """Per demonstration count: n_examples, exact_match (greedy generation, the answer and
    nothing more) and teacher_forced (argmax right at every answer token)."""
    rows = []
    for n_demos, group in _by_demos(examples).items():
        batch = make_batch(model, *dyck_batch(group))
        forced = 0
        for mb in micro_batches(batch, batch_size, "dyck accuracy"):
            with torch.no_grad():
                logits = model(mb.tokens)
            forced += int(
                answer_scores(logits, mb.tokens, [ex.answer_span for ex in group[mb.rows]])[1].sum()
            )
        rows.append(
            {
                "n_demos": n_demos,
                "n_examples": len(group),
                "exact_match": exact_match_accuracy(model, group, batch_size=max(batch_size, 32)),
                "teacher_forced": forced / len(group),
            }
        )
    return pd.DataFrame(rows)


def run(model: SmeltModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    examples = inputs.dyck_examples()
    masses = prompt_masses(model, examples, batch_size=opts.batch_size, chunk=opts.chunk)
    tables = case_study(masses, model.schedule, seed=inputs.seed)
    return {
        "visits": tables["visits"],
        "heads": tables["heads"],
        "accuracy": accuracy(model, examples, batch_size=opts.batch_size),
        "trend": tables["trend"],
        "visit_diff": tables["visit_diff"],
    }


def summarize(result: Tables) -> pd.DataFrame:
    visits, acc = result["visits"], result["accuracy"]
    demos = with_demos(visits)
    middle = demos[demos["layer"].isin(loop_span(visits))]
    rows = [
        (
            f"{stat.replace('_', ' ')} from answers, loop span, visit {v}",
            part[stat].mean(),
            paper.DYCK[stat].at_visit(v),
        )
        for stat in ("bos_mass", "demo_mass")
        for v, part in middle.groupby("visit")
    ]
    rows += [(f"exact match, {n} demos", a, "") for n, a in zip(acc["n_demos"], acc["exact_match"])]
    rows += [
        (
            f"bos mass slope per effective depth, {r.n_demos} demos "
            f"(95% CI {r.lo:.3f}..{r.hi:.3f})",
            r.slope,
            "",
        )
        for r in result.get("trend", pd.DataFrame()).itertuples()
        if r.statistic == "bos_mass"
    ]
    rows += [
        (
            f"{r.statistic.replace('_', ' ')} visit 1 - visit 0, layer {r.layer}, {r.n_demos} "
            f"demos (95% CI {r.lo:.3f}..{r.hi:.3f})",
            r.diff,
            "",
        )
        for r in result.get("visit_diff", pd.DataFrame()).itertuples()
        if r.n_demos == result["visit_diff"]["n_demos"].max()
    ]
    return summary(rows)


PROBE = ProbeSpec(
    "dyck",
    "Dyck in-context case study: attention from answer positions onto BOS and "
    "onto demonstration answers, per visit; exact-match accuracy.",
    run,
    summarize,
    tables=("visits", "heads", "accuracy", "trend", "visit_diff"),
    figures=(
        FigureSpec(
            "dyck_mass",
            "visits",
            "Dyck: attention from the answer positions (prompts with demonstrations)",
        ),
        FigureSpec("dyck_paper", "visits", "Dyck: loop-span means per visit, ours and the paper"),
    ),
    page="/dyck",
)


if __name__ == "__main__":  # the same as `python -m smelt_interp.probes NAME ...`
    registry.run_as_command(PROBE)
