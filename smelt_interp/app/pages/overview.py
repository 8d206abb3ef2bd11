"""Overview: the models served, their configs and budgets (parameters, FLOPs, KV cache,
sparsity and the Baseline/SMELT mismatches), sink mass by effective depth (each model on its own
task's held-out rows: recall rows for a recall checkpoint), and the sink over
training (from the metrics.jsonl beside each checkpoint). A matched pair shows one sparsity S,
as the paper's grid does (budget.pair_sparsity). A transformers model folder (an adapted looped
model, smelt_interp.adapters) shows its shape and schedule; the budgets are SMELT/Baseline
configs' only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dash import Output, dcc, html

from smelt_interp.app import components as ui
from smelt_interp.app import urls
from smelt_interp.app import value_kinds as kind
from smelt_interp.app.controls import Control, Controls
from smelt_interp.app.figure_cache import FigureCache, file_stamp
from smelt_interp.app.probe_tables import batch_description, own_task_tables
from smelt_interp.app.served import Served, metrics_path, shortest_context, sink_training
from smelt_interp.budget import TOLERANCES, budget_table, mismatch_table
from smelt_interp.config import ModelConfig
from smelt_interp.fields import is_int
from smelt_interp.figures.loop import sink_by_depth
from smelt_interp.figures.sink_training import sink_over_training
from smelt_interp.figures.theme import model_color
from smelt_interp.probes.registry import get

if TYPE_CHECKING:
    import pandas as pd

PATH = "/"
TITLE = "Overview"
PROBES = ("sink",)  # the registered probes whose tables this page draws
# the page's one control, declared once (it has no URL keys); QUERY and INPUTS follow
CONTROLS = Controls(load=Control("overview-load", "data", kind.ANY))  # the page has appeared
QUERY: urls.Query = CONTROLS.query
INPUTS = CONTROLS.kinds

ADAPTED_SINK_NOTE = (
    " A transformers model whose tokenizer adds no BOS is measured on its first token; one with "
    "learned sinks has its sink slot's mass (1 minus a row's sum) in thin lines beside."
)
CONFIG_ROWS = (
    ("d_model", "d_model"),
    ("n_layers", "layers"),
    ("n_heads", "query heads"),
    ("n_kv_heads", "KV heads"),
    ("d_head", "d_head"),
    ("n_experts", "experts"),
    ("top_k", "top-k"),
    ("d_expert", "d_expert"),
    ("max_seq_len", "max_seq_len"),
)


def _si(x: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.2f} {unit}"
    return f"{x:.0f}"


def is_own(cfg) -> bool:
    """Whether `cfg` is this project's SMELT/Baseline config (not an adapted model's shape)."""
    return isinstance(cfg, ModelConfig)


def architecture(cfg) -> str:
    if is_own(cfg):
        return "SMELT (looped)" if cfg.is_looped else "Baseline"
    routed = f", {cfg.n_experts} experts top-{cfg.top_k}" if cfg.n_experts > 1 else ", dense"
    return f"{cfg.arch} (transformers{routed})"


def _model_card(served: Served, name: str, index: int) -> html.Section:
    cfg, info = served.registry.cfg(name), served.registry.info(name)
    ev = info.eval
    items = [
        ("architecture", architecture(cfg)),
        ("loop", cfg.loop_text),
        ("effective depth", str(cfg.effective_depth)),
    ]
    if not is_own(cfg):
        items.append(("learned sinks", "yes" if cfg.learned_sinks else "no"))
        first = "none: the first token stands in" if cfg.first_token_id is None else "BOS"
        items.append(("sink measured on", first))
    if info.step is not None:
        items.append(("trained steps", f"{info.step:,}" + ("" if info.final else " (unfinished)")))
    if "dyck_exact_match" in ev:
        items.append(("Dyck exact match", f"{ev['dyck_exact_match']:.1%}"))
    if "loss/dyck" in ev:
        items.append(("Dyck loss", f"{ev['loss/dyck']:.3f}"))
    dl = html.Dl(sum(([html.Dt(k), html.Dd(v)] for k, v in items), []), className="kv")
    return html.Section(
        [
            html.H3(
                [
                    html.Span(className="swatch", style={"background": model_color(name, index)}),
                    name,
                ]
            ),
            html.Div(str(served.registry.paths[name]), className="path"),
            dl,
        ],
        className="card model-card",
    )


def _seq_len(served: Served) -> int:
    lens = [
        (served.registry.info(n).train_config or {}).get("seq_len") for n in served.registry.names
    ]
    lens = [x for x in lens if is_int(x)]
    return max(lens) if lens else shortest_context(served)


def _sparsity_note(budgets: pd.DataFrame, pair: tuple[str, str]) -> str:
    """What the S column means for this pair: one S shared, or each model's own."""
    dense = (
        "1 - FLOPs / FLOPs of a dense control with the same non-embedding parameters, each used "
        "once per token"
    )
    if budgets.loc[pair[0], "shared_S"]:
        return (
            f"Sparsity S = {budgets.loc[pair[0], 'sparsity']:.1%} for the pair ({dense}): a "
            "matched pair shares one S, its Baseline's, as in the paper's grid."
        )
    return (
        f"Sparsity S ({dense}) is each model's own: {pair[1]} is not matched to {pair[0]} "
        "within tolerance, so the two do not share one."
    )


def layout(served: Served, state: dict) -> html.Div:
    names = served.registry.names
    cfgs = {n: served.registry.cfg(n) for n in names}
    seq_len = _seq_len(served)
    config_rows = [
        [label] + [str(getattr(cfgs[n], key, "–")) for n in names] for key, label in CONFIG_ROWS
    ]
    config_rows.append(["loop span"] + [cfgs[n].loop_text for n in names])
    pair = served.registry.pair()
    own = {n: cfg for n, cfg in cfgs.items() if is_own(cfg)}
    adapted = [n for n in names if n not in own]
    budget_children = budget_section(own, seq_len, pair) if own else []
    if adapted:
        budget_children.append(
            html.P(
                f"Budgets apply to SMELT/Baseline configs only: {', '.join(adapted)} "
                f"({'is a transformers model' if len(adapted) == 1 else 'are transformers models'}"
                "), shown by shape in the configurations.",
                className="note budget-adapted",
            )
        )
    return html.Div(
        [
            ui.page_head(
                "Overview",
                f"{len(names)} model{'s' if len(names) != 1 else ''} loaded. SMELT runs the middle "
                "of its stack twice (a loop), paying for the extra visits with a narrower, sparser "
                "model; the budgets below say how well the pair is matched.",
            ),
            html.Div([_model_card(served, n, i) for i, n in enumerate(names)], className="models"),
            html.Div(
                [
                    ui.card(ui.table(["", *names], config_rows), title="Configurations"),
                    ui.card(
                        *budget_children,
                        title="Budgets",
                        subtitle=f"per token, at sequence length {seq_len}",
                    ),
                ],
                className="grid-2",
            ),
            ui.card(
                ui.graph("overview-sink"),
                dcc.Store(id=CONTROLS.id("load"), data=0),
                title="Sink mass by effective depth",
                subtitle="Mean attention on BOS over heads, one line per visit, on "
                f"{batch_description(served)} (a model trained on associative recall: as many "
                "held-out rows of its own task). The shaded band is SMELT's second pass over its "
                "loop." + (ADAPTED_SINK_NOTE if adapted else ""),
            ),
            training_card(),
        ]
    )


def budget_section(cfgs: dict, seq_len: int, pair: tuple[str, str] | None) -> list:
    """The budget table of this project's configs, with the pair's mismatches where a matched
    pair is served."""
    budgets = budget_table(cfgs, seq_len, pair)
    budget_rows = [
        [
            n,
            f"{int(b.non_embedding_params):,}",
            _si(b.flops_per_token),
            f"{int(b.kv_bytes_per_token):,}",
            f"{b.sparsity:.1%}",
            int(b.effective_depth),
        ]
        for n, b in budgets.iterrows()
    ]
    budget_children = [
        ui.table(
            [
                "model",
                "non-embedding params",
                "FLOPs / token",
                "KV bytes / token",
                "sparsity S",
                "effective depth",
            ],
            budget_rows,
        )
    ]
    if pair:
        mm = mismatch_table(cfgs[pair[0]], cfgs[pair[1]], seq_len)
        rows = [
            [
                q,
                f"{r.baseline:,.0f}",
                f"{r.smelt:,.0f}",
                f"{r.mismatch:+.2%}",
                f"±{r.tolerance:.0%}",
                html.Span(
                    "within" if r.within else "outside",
                    className=f"badge {'ok' if r.within else 'bad'}",
                ),
            ]
            for q, r in mm.iterrows()
        ]
        budget_children += [
            html.H3(
                f"Mismatch: {pair[1]} vs {pair[0]}",
                className="card-title",
                style={"marginTop": "16px"},
            ),
            ui.table(["quantity", pair[0], pair[1], "mismatch", "tolerance", ""], rows),
            html.P(
                f"The paper reaches under {TOLERANCES['flops']:.0%} on FLOPs and KV and under "
                f"{TOLERANCES['params']:.0%} on parameters.",
                className="note",
            ),
            html.P(_sparsity_note(budgets, pair), className="note sparsity-note"),
        ]
    return budget_children


def training_card() -> html.Section:
    """When the sink appeared: the trainer's periodic evaluations, read beside each checkpoint."""
    return ui.card(
        ui.graph("overview-sink-training"),
        title="Sink over training",
        subtitle="From each served checkpoint's metrics.jsonl: Sink^0.3 as Gu et al. compute it "
        "(per row, the share of heads whose mean attention on BOS over queries 0..63 exceeds "
        "0.3, averaged over rows; the pooled figure for logs older than it) and the mean BOS "
        "mass per layer and visit, on held-out rows at each evaluation.",
    )


def own_task_sink(served: Served) -> dict:
    """{model: the sink probe's `visits` table} with each model on its own task's rows."""
    return {n: t["visits"] for n, t in own_task_tables(served, get("sink")).items()}


def register(app, served: Served) -> None:
    figures = FigureCache(served.registry)  # the page's answers, shared between users

    @app.callback(Output(ui.gid("overview-sink"), "figure"), *CONTROLS.inputs("load"))
    def _sink(_):
        return figures.answer("sink", (), lambda: sink_by_depth(own_task_sink(served)))

    @app.callback(Output(ui.gid("overview-sink-training"), "figure"), *CONTROLS.inputs("load"))
    def _sink_training(_):
        # a run may still be writing its metrics: the logs' stamps are part of the answer's key
        names = served.registry.names
        logs = [str(file_stamp(metrics_path(served, n))) for n in names]
        return figures.answer(
            "sink training",
            logs,
            lambda: sink_over_training({n: sink_training(served, n) for n in names}),
        )
