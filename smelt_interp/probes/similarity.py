"""Q/K/V similarity and top-k attended-key overlap between the two visits of a looped layer,
each beside its chance level (measure.chance): for the cosines, the same visit pair on
token-shuffled rows (each token against a random other one); for the top-k overlap, random top-k
sets at each query's length, with the chance-normalised overlap; and the paper's control, the
same statistic between layer l and layer l + 1, both visit 0 (for the cosines that compares
vectors projected by different weights, so it is no control; the table keeps it as the paper's).

Per token and head: cosine of q (query heads), k and v (kv heads, reported on the query heads
that read them, head // n_group); per query and head: the share of its 8 most attended keys
that the two attention computations share, over the queries that see more than 8 keys (the
first 8 queries attend to all their keys in both, so they would share them by construction).
All averaged over valid tokens. Rows: the looped layers of a SMELT model; every layer of a
Baseline, which has only the control columns.

    python -m smelt_interp.probes.similarity ckpt.pt [--data dyck] [--compare OTHER] [--csv OUT]
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from smelt_interp import paper
from smelt_interp.errors import ProbeError
from smelt_interp.measure.attention_stats import DEFAULT_CHUNK, head_overlap
from smelt_interp.measure.batching import (
    DEFAULT_BATCH,
    Accumulator,
    capture,
    make_batch,
    micro_batches,
    visit_names,
)
from smelt_interp.measure.chance import normalised, shuffled_cos_sum, topk_chance_sum
from smelt_interp.measure.position_mass import qk_hook_names, visit_rows
from smelt_interp.model.protocol import LoopedModel, hook_name
from smelt_interp.probes.common import check_visit
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary

TOP = 8
QKV = ("q", "k", "v")
SHUFFLE_SEED = 0  # the token permutations of the shuffled-token cosine control


def _pairs(
    model: LoopedModel, visits: tuple[int, int]
) -> list[tuple[int, str, tuple[int, int], tuple[int, int]]]:
    """(layer, kind, (layer, visit a), (layer', visit b)) for the loop pairs and the controls."""
    cfg = model.cfg
    layers = cfg.looped_layers or tuple(range(cfg.n_layers - 1))
    if not layers:
        raise ProbeError(
            "similarity needs a looped layer or two layers to compare; this model has one layer"
        )
    out = []
    for layer in layers:
        if cfg.is_looped:
            for v in visits:
                check_visit(model, layer, v)
            out.append((layer, "loop", (layer, visits[0]), (layer, visits[1])))
        if layer + 1 < cfg.n_layers:
            out.append((layer, "ctrl", (layer, 0), (layer + 1, 0)))
    return out


def _cos_sum(a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Cosine per token and head summed over valid tokens: [b, T, h, d] x2 -> [h] (float64)."""
    cos = F.cosine_similarity(a.double(), b.double(), dim=-1)  # [b, T, h]
    return (cos * valid[..., None]).sum(dim=(0, 1))


def _means(
    acc: Accumulator, key: tuple[int, str], head: int, group: int, top: int, prefix: str
) -> dict:
    """The four statistics of one head for one pair kind, NaN where the pair does not exist."""

    def get(stat: str, index: int) -> float:
        return float(acc.mean((*key, stat))[index]) if (*key, stat) in acc else float("nan")

    out = {f"{prefix}cos_{x}": get(x, head if x == "q" else head // group) for x in QKV}
    if not prefix:  # the same visit pair on token-shuffled rows: the cosines' control
        out |= {f"shuf_cos_{x}": get(f"shuf_{x}", head if x == "q" else head // group) for x in QKV}
    overlap, chance = get("top", head), get("top_chance", 0)
    out[f"{prefix}top{top}_overlap"] = overlap
    out[f"{prefix}top{top}_chance"] = chance
    out[f"{prefix}top{top}_overlap_norm"] = normalised(overlap, chance)
    return out


def measure(
    model: LoopedModel,
    tokens: torch.Tensor,
    lengths: torch.Tensor | Sequence[int] | None = None,
    *,
    visits: tuple[int, int] = (0, 1),
    top: int = TOP,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
) -> pd.DataFrame:
    """Columns: layer, head, kv_head, then for a looped model cos_q, cos_k, cos_v (visit a vs
    b), shuf_cos_q, shuf_cos_k, shuf_cos_v (the same visits, each token against a random other
    token: the cosines' control), top8_overlap, top8_chance (random top-8 sets at each query's
    length), top8_overlap_norm ((overlap - chance) / (1 - chance)); then control_layer (l + 1,
    NaN where none), ctrl_cos_q, ctrl_cos_k, ctrl_cos_v, ctrl_top8_overlap, ctrl_top8_chance,
    ctrl_top8_overlap_norm. The top-k columns are named after `top`."""
    cfg = model.cfg
    batch = make_batch(model, tokens, lengths)
    pairs = _pairs(model, visits)
    used = sorted({lv for _, _, a, b in pairs for lv in (a, b)})
    source = cfg.attention_source
    names = visit_names(model, used, *(f"attn.hook_{x}" for x in QKV))
    names += [n for n in qk_hook_names(used, source) if n not in names]
    acc = Accumulator()
    shuffle = torch.Generator().manual_seed(SHUFFLE_SEED)
    for mb in micro_batches(batch, batch_size, "similarity"):
        _, cache = capture(model, mb.tokens, names)
        act = {(lv, x): cache[hook_name(*lv, f"attn.hook_{x}")] for lv in used for x in QKV}
        hidden = model.hidden_keys(mb.tokens)
        n_tokens = mb.valid.sum()
        for layer, kind, a, b in pairs:
            for x in QKV:
                acc.add((layer, kind, x), _cos_sum(act[a, x], act[b, x], mb.valid), n_tokens)
                if kind == "loop":
                    shuf = shuffled_cos_sum(act[a, x], act[b, x], mb.valid, shuffle)
                    acc.add((layer, kind, f"shuf_{x}"), shuf, n_tokens)
            overlap = head_overlap(
                visit_rows(source, cache, *a, hidden.get(a[0])),
                visit_rows(source, cache, *b, hidden.get(b[0])),
                mb.valid,
                top,
                chunk,
            )
            acc.add((layer, kind, "top"), *overlap)
            acc.add((layer, kind, "top_chance"), topk_chance_sum(mb.valid, top)[None], overlap[1])
    rows = []
    for layer in sorted({p[0] for p in pairs}):
        has_ctrl = (layer, "ctrl", "q") in acc
        for head in range(cfg.n_heads):
            row: dict = {"layer": layer, "head": head, "kv_head": head // cfg.n_group}
            if cfg.is_looped:
                row |= _means(acc, (layer, "loop"), head, cfg.n_group, top, "")
            row["control_layer"] = layer + 1 if has_ctrl else float("nan")
            row |= _means(acc, (layer, "ctrl"), head, cfg.n_group, top, "ctrl_")
            rows.append(row)
    return pd.DataFrame(rows)


def run(model: LoopedModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    tokens, lengths = inputs.batch()
    return {"heads": measure(model, tokens, lengths, batch_size=opts.batch_size, chunk=opts.chunk)}


def paper_band(table: dict[str, paper.Reference], col: str, top: int) -> str:
    """The paper's value beside `col`: its band where it measured the same quantity; for a
    top-k overlap at a k other than the paper's 8, its top-8 band marked as a different k."""
    if col in table:
        return table[col].table_text()
    if col == f"top{top}_overlap" and "top8_overlap" in table:
        return f"top-8: {table['top8_overlap'].table_text()} (k differs: top-{top} here)"
    return ""


def summarize(result: Tables) -> pd.DataFrame:
    df = result["heads"]
    top_col = next(c for c in df.columns if c.startswith("ctrl_top") and c.endswith("_overlap"))
    top_col = top_col[len("ctrl_") :]
    top = int(top_col[len("top") : -len("_overlap")])
    chance_col = top_col.replace("_overlap", "_chance")
    rows = []
    for col in ("cos_q", "cos_k", "cos_v"):
        if col in df:
            rows.append(
                (f"{col} (visit 0 vs 1)", df[col].mean(), paper_band(paper.SIMILARITY, col, top))
            )
            rows.append(
                (f"{col} control (the same visits, tokens shuffled)", df["shuf_" + col].mean(), "")
            )
        rows.append(
            (
                f"{col}, layer l vs l+1 (different projections; no control)",
                df["ctrl_" + col].mean(),
                "",
            )
        )
    for prefix, what, table in (
        ("", "visit 0 vs 1", paper.SIMILARITY),
        ("ctrl_", "control, layer l vs l+1", paper.SIMILARITY_CONTROL),
    ):
        if prefix + top_col not in df:
            continue
        overlap, chance = df[prefix + top_col].mean(), df[prefix + chance_col].mean()
        rows += [
            (f"{top_col} ({what})", overlap, paper_band(table, top_col, top)),
            (
                f"{top_col} chance ({what}: random top-{top} sets at each query's length)",
                chance,
                "",
            ),
            (
                f"{top_col} chance-normalised ({what}: (overlap - chance) / (1 - chance))",
                normalised(overlap, chance),
                "",
            ),
        ]
    return summary(rows)


PROBE = ProbeSpec(
    "similarity",
    "Q/K/V cosine and top-8 attended-key overlap between visits, with chance levels: "
    "the cosines on token-shuffled rows, random top-8 sets at each query's length, and the "
    "consecutive-layer top-8 control.",
    run,
    summarize,
    tables=("heads",),
    figures=(
        FigureSpec(
            "qkv_similarity",
            "heads",
            "similarity of the visits, beside layer l vs l + 1 (bands: paper)",
            per_model=True,
        ),
    ),
)


if __name__ == "__main__":  # the entry point: the same as `python -m smelt_interp.probes NAME`
    from smelt_interp.probes.cli import run_probe_command

    run_probe_command(PROBE)
