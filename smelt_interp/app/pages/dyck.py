"""Dyck case study: build an in-context Dyck prompt (or type one), see both models' completions
marked right or wrong, and where the answer positions look in each visit: BOS or the
demonstrations' answers, beside the paper's values (smelt_interp.paper.DYCK)."""

from __future__ import annotations

from dash import Input, Output, dcc, html, no_update

from smelt_interp import paper
from smelt_interp.app import components as ui
from smelt_interp.app import guard, urls
from smelt_interp.app.compute import DEFAULT_DYCK, Workbench, generate_dyck
from smelt_interp.app.controls import Control, Controls
from smelt_interp.app.pages import attention
from smelt_interp.errors import PromptError
from smelt_interp.figures import dyck as figs
from smelt_interp.figures.theme import message_figure
from smelt_interp.probes.registry import get

PATH = "/dyck"
TITLE = "Dyck case study"
PROBES = ("case_study",)  # the registered probes whose tables this page draws
# the page's controls (the URL keys in URL order), declared once; QUERY and INPUTS follow
CONTROLS = Controls(
    pairs=Control("dyck-pairs", "value", guard.NUMBER, url=int),
    depth=Control("dyck-depth", "value", guard.NUMBER, url=int),
    demos=Control("dyck-demos", "value", guard.NUMBER, url=int),
    seed=Control("dyck-seed", "value", guard.NUMBER, url=int),
    dyck=Control("dyck-applied", "data", guard.PROMPT, url=str),
    text=Control("dyck-prompt", "value", guard.PROMPT),
    load=Control("dyck-aggregate-load", "data", guard.ANY),  # a trigger: the page has appeared
)
QUERY: urls.Query = CONTROLS.query
INPUTS = CONTROLS.kinds
# the Attention page's keys that "Open it on the Attention page" sets
ATTENTION_LINK: urls.Query = {key: attention.QUERY[key] for key in ("model", "prompt")}


def _int(value, default: int, lo: int, hi: int) -> int:
    try:
        return min(hi, max(lo, int(value)))
    except (TypeError, ValueError):
        return default


def settings(state: dict) -> dict[str, int]:
    d = DEFAULT_DYCK
    return {
        "pairs": _int(state.get("pairs"), d["pairs"], 1, 4),
        "depth": _int(state.get("depth"), d["depth"], 1, 10),
        "demos": _int(state.get("demos"), d["demos"], 0, 8),
        "seed": _int(state.get("seed"), d["seed"], 0, 10**9),
    }


def _num(id: str, value: int, lo: int, hi: int) -> dcc.Input:
    return dcc.Input(
        id=id, type="number", value=value, min=lo, max=hi, step=1, className="num", debounce=True
    )


def layout(wb: Workbench, state: dict) -> html.Div:
    s = settings(state)
    text = state.get("case_study")
    if not text:
        try:
            text = generate_dyck(s["pairs"], s["depth"], s["demos"], s["seed"], wb.max_seq_len)
        except PromptError:
            text = "( [ {"
    return html.Div(
        [
            ui.page_head(
                "Dyck case study",
                "Close the brackets of a query after a few solved demonstrations. In the paper, "
                "the answer positions of SMELT's first visit look mostly at BOS and its second "
                "visit at the demonstrations' answers.",
            ),
            html.Div(
                [
                    ui.card(
                        html.Div(
                            [
                                ui.field(
                                    "Bracket pairs",
                                    ui.radio(CONTROLS.id("pairs"), [1, 2, 3, 4], s["pairs"]),
                                ),
                                ui.field(
                                    "Max depth", _num(CONTROLS.id("depth"), s["depth"], 1, 10)
                                ),
                                ui.field(
                                    "Demonstrations", _num(CONTROLS.id("demos"), s["demos"], 0, 8)
                                ),
                                ui.field("Seed", _num(CONTROLS.id("seed"), s["seed"], 0, 10**9)),
                                html.Button(
                                    "Generate", id="dyck-generate", n_clicks=0, className="button"
                                ),
                            ],
                            className="controls",
                        ),
                        html.P(
                            "Held-out examples (never seen in training), sized to fit the "
                            "models' context.",
                            className="note",
                        ),
                        html.Div(
                            ui.prompt_box(
                                "dyck",
                                text,
                                rows=5,
                                placeholder="one bracket prefix per line; "
                                "the last line is the query",
                            ),
                            style={"marginTop": "14px"},
                        ),
                        ui.message("dyck-msg"),
                        title="Prompt",
                        subtitle="Demonstrations' inputs, one per line (they are answered "
                        "correctly in the prompt), then the query on the last line.",
                    ),
                    ui.card(html.Div(id="dyck-results"), title="Completions"),
                ],
                className="grid-2",
            ),
            ui.card(
                ui.graph("dyck-mass"),
                title="Where the answer looks, by effective depth",
                subtitle="Attention from the positions that predict the answer, averaged over "
                "heads.",
            ),
            ui.card(
                html.Div(id="dyck-paper", className="paper-line"),
                ui.graph("dyck-paper-fig"),
                title="Loop span, visit 0 vs visit 1, beside the paper",
                subtitle="Means over the looped layers (for a Baseline: the layers the recipe "
                "would loop) for this one prompt; the paper averages many.",
            ),
            aggregate_card(wb),
        ]
    )


def aggregate_card(wb: Workbench) -> html.Section:
    """The case study over many held-out prompts, beside the single prompt above."""
    return ui.card(
        dcc.Store(id=CONTROLS.id("load"), data=0),
        html.Div(id="dyck-aggregate-text", className="paper-line"),
        ui.graph("dyck-aggregate"),
        title="Over many held-out prompts",
        subtitle=f"{wb.prompts_description}, computed once per model (the case_study probe). Shown "
        f"for {max(wb.probe_inputs.demos)} demonstrations; bars and brackets: 95% percentile "
        "bootstrap intervals over prompts.",
    )


def _ci(value: float, lo: float, hi: float) -> str:
    return f"{value:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def aggregate(wb: Workbench) -> tuple:
    """(figure, lines): per model, the visit-1 minus visit-0 change at each looped layer, or
    for a model without a loop the BOS mass's slope against effective depth, with intervals."""
    most = max(wb.probe_inputs.demos)
    tables = wb.probe_tables(get("case_study"))
    frames = {n: t["visits"][t["visits"]["n_demos"] == most] for n, t in tables.items()}
    bos, demo = paper.DYCK_BOS_MASS, paper.DYCK_DEMO_MASS
    lines: list = [
        f"paper (SMELT), visit 1 - visit 0: BOS {bos.hi - bos.lo:+.2f}, "
        f"demonstrations {demo.hi - demo.lo:+.2f}"
    ]
    for n, t in tables.items():
        diff = t["visit_diff"][t["visit_diff"]["n_demos"] == most]
        trend = t["trend"][
            (t["trend"]["n_demos"] == most) & (t["trend"]["statistic"] == "bos_mass")
        ]
        parts = [
            f"layer {r.layer} {r.statistic.replace('_mass', '')} {_ci(r.diff, r.lo, r.hi)}"
            for r in diff.itertuples()
        ]
        parts += [
            f"BOS mass slope per depth {_ci(r.slope, r.lo, r.hi)}" for r in trend.itertuples()
        ]
        lines += [html.Br(), html.Span([html.B(f"ours ({n}): "), "; ".join(parts)])]
    return figs.mass_with_intervals(frames), lines


def _preview(ex) -> html.Pre:
    return html.Pre([ex.prompt, html.Mark(ex.answer)], className="dyck")


def register(app, wb: Workbench) -> None:
    @app.callback(
        CONTROLS["text"].output(),
        CONTROLS["dyck"].output(allow_duplicate=True),
        Output("dyck-msg", "children", allow_duplicate=True),
        Output("dyck-msg", "style", allow_duplicate=True),
        Input("dyck-generate", "n_clicks"),
        *CONTROLS.states("pairs", "depth", "demos", "seed"),
        prevent_initial_call=True,
    )
    def _generate(_, pairs, depth, demos, seed):
        s = settings({"pairs": pairs, "depth": depth, "demos": demos, "seed": seed})
        try:
            text = generate_dyck(s["pairs"], s["depth"], s["demos"], s["seed"], wb.max_seq_len)
        except PromptError as exc:
            return (no_update, no_update, *ui.show_message(str(exc)))
        return text, text, *ui.show_message(None)

    ui.run_prompt_on_click(app, "dyck")

    @app.callback(
        Output(ui.gid("dyck-aggregate"), "figure"),
        Output("dyck-aggregate-text", "children"),
        *CONTROLS.inputs("load"),
    )
    def _aggregate(_):
        return aggregate(wb)

    @app.callback(
        Output("dyck-results", "children"),
        Output(ui.gid("dyck-mass"), "figure"),
        Output(ui.gid("dyck-paper-fig"), "figure"),
        Output("dyck-paper", "children"),
        Output("dyck-msg", "children"),
        Output("dyck-msg", "style"),
        *CONTROLS.inputs("dyck"),
    )
    def _results(text):
        return results(wb, text)

    urls.write_to_url(app, QUERY, CONTROLS.url_sources())


def _mass_line(who: str, bos, demo) -> html.Span:
    """'<who>: BOS a → b, demonstrations c → d': the answer positions' attention mass in visit
    0 → visit 1."""
    visits = lambda values: " → ".join(f"{v:.2f}" for v in values)
    return html.Span(
        [f"{who}: BOS ", html.B(visits(bos)), ", demonstrations ", html.B(visits(demo))]
    )


def results(wb: Workbench, text: str):
    """(completions panel, mass figure, paper figure, paper line, message, message style)."""
    try:
        cases = {n: wb.dyck_case(n, text) for n in wb.registry.names}
    except PromptError as exc:
        blank = message_figure(ui.NO_FIGURE)
        return (html.P("—", className="note"), blank, blank, "", *ui.show_message(str(exc)))
    ex = next(iter(cases.values())).example
    rows = [
        [
            html.B(n),
            html.Code(c.completion or "(nothing)", className="mono"),
            html.Code(ex.answer, className="mono"),
            html.Span(
                "right" if c.correct else "wrong", className=f"badge {'ok' if c.correct else 'bad'}"
            ),
        ]
        for n, c in cases.items()
    ]
    link = attention.PATH + urls.encode(
        ATTENTION_LINK, {"model": wb.registry.valid(None), "prompt": ex.text}
    )
    panel = html.Div(
        [
            ui.table(["model", "completion", "expected", ""], rows, class_name="completions"),
            html.H3("Full example", className="card-title", style={"marginTop": "14px"}),
            _preview(ex),
            html.P(
                [
                    f"{len(ex.ids)} tokens, {ex.n_demos} "
                    f"demonstration{'s' if ex.n_demos != 1 else ''}. ",
                    dcc.Link("Open it on the Attention page →", href=link),
                ],
                className="note",
            ),
        ]
    )
    frames = {n: c.visits for n, c in cases.items()}
    bos, demo = paper.DYCK_BOS_MASS, paper.DYCK_DEMO_MASS
    line = [_mass_line("paper (SMELT)", (bos.lo, bos.hi), (demo.lo, demo.hi))]
    for n, frame in frames.items():
        means = figs.loop_span_means(frame)
        line.append(_mass_line(f"ours ({n})", means["bos_mass"], means["demo_mass"]))
    return (
        panel,
        figs.mass_by_depth(frames),
        figs.paper_comparison(frames),
        line,
        *ui.show_message(None),
    )
