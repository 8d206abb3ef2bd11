"""`python -m smelt_interp.probes.patching MODEL [...]` (also `python -m
smelt_interp.commands.patching`): patch a prompt pair on a checkpoint or a looped model folder
and print the nodes that carry the answer (probes.patching says what each table holds).

    --pair dyck|recall                  the model's task by default
    --clean TEXT --corrupt TEXT         or --clean-ids 1,2,3 --corrupt-ids 1,2,4 (equal lengths)
    --answers CLEAN,CORRUPT             token ids scored (default: the model's predictions)
    --metric logit_diff|loss  --site z|q|k|v|resid_pre|resid_mid|resid_post|attn_out|mlp_out
    --per-position                      one node per position too
    --sender 1.0.2 [--sender ...] --receiver 1.1.0.v [--freeze-mlp]    path patching
    --csv OUT  --json OUT
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from smelt_interp.cli import ArgumentParser, int_at_least, run_cli
from smelt_interp.data.patch_pairs import PAIR_KINDS
from smelt_interp.files import atomic_write_many, check_outputs, json_text
from smelt_interp.loading import load_model
from smelt_interp.measure.patch_tables import cross_visits, headline, side_by_side, top_nodes
from smelt_interp.measure.patching import DEFAULT_COPIES, HEAD_SITES, METRICS, SITES, Node
from smelt_interp.measure.path_patching import RECEIVER_SITES, path_patching
from smelt_interp.probes.patching import PairRequest, request_pair


def _ids(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ids like 1,17,42, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected ids >= 0 like 1,17,42, got {text!r}")
    return values


def _answers(text: str) -> tuple[int, int]:
    values = _ids(text)
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"expected two ids CLEAN,CORRUPT, got {text!r}")
    return values[0], values[1]


def _node(parts: int, sites: tuple[str, ...]) -> Callable[[str], Node]:
    """A parser of 'L.V.H' (parts 3) or 'L.V.H.SITE' (parts 4) into a Node."""

    def parse(text: str) -> Node:
        bits = text.split(".")
        try:
            if len(bits) != parts:
                raise ValueError
            layer, visit, head = (int(b) for b in bits[:3])
        except ValueError:
            shape = "L.V.H" if parts == 3 else "L.V.H.q|k|v"
            raise argparse.ArgumentTypeError(f"expected {shape}, got {text!r}") from None
        site = bits[3] if parts == 4 else "z"
        if site not in sites:
            raise argparse.ArgumentTypeError(f"the site must be one of {', '.join(sites)}")
        return Node(layer, visit, site, head)

    return parse


def parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="python -m smelt_interp.probes.patching",
        description="Activation, attribution, cross-visit and path patching of a prompt pair "
        "per (layer, visit, head); 0 = the corrupted run, 1 = the clean run.",
    )
    p.add_argument("model", type=Path, help="a ckpt.pt or a local transformers folder")
    p.add_argument("--pair", choices=PAIR_KINDS, default=None)
    p.add_argument("--clean", default=None, help="the clean prompt's text")
    p.add_argument("--corrupt", default=None, help="the corrupted prompt's text")
    p.add_argument("--clean-ids", type=_ids, default=None)
    p.add_argument("--corrupt-ids", type=_ids, default=None)
    p.add_argument("--answers", type=_answers, default=None)
    p.add_argument("--metric", choices=METRICS, default="logit_diff")
    p.add_argument("--site", choices=tuple(SITES), default="z")
    p.add_argument("--per-position", action="store_true")
    p.add_argument("--sender", type=_node(3, ("z",)), action="append", default=[])
    p.add_argument("--receiver", type=_node(4, RECEIVER_SITES), default=None)
    p.add_argument("--freeze-mlp", action="store_true")
    p.add_argument("--n-rows", type=int_at_least(1), default=8)
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--batch", type=int_at_least(1), default=DEFAULT_COPIES)
    p.add_argument("--top", type=int_at_least(1), default=10)
    p.add_argument("--device", default=None)
    p.add_argument("--csv", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    return p


def tables_of(args: argparse.Namespace) -> dict[str, pd.DataFrame]:
    """Every table the arguments ask for, from one model and one pair."""
    if bool(args.sender) != (args.receiver is not None):
        raise argparse.ArgumentTypeError("path patching needs --sender and --receiver together")
    model, info = load_model(args.model, args.device)
    request = PairRequest(
        args.pair, args.clean, args.corrupt, args.clean_ids, args.corrupt_ids, args.answers,
        args.n_rows, args.seed,
    )  # fmt: skip
    pair = request_pair(model, info, request)
    kw = dict(metric=args.metric, batch=args.batch)
    path = None  # first: a bad sender or receiver is refused before the long work
    if args.receiver is not None:
        path = path_patching(
            model, pair, args.sender, args.receiver, freeze_mlp=args.freeze_mlp, **kw
        )
    nodes = side_by_side(
        model, pair, args.site, per_head=args.site in HEAD_SITES,
        per_position=args.per_position, **kw,
    )  # fmt: skip
    tables = {"nodes": nodes, "cross_visit": cross_visits(model, pair, args.site, **kw)}
    if path is not None:
        tables["path"] = path
    tables["nodes"].attrs["pair"] = pair.label
    return tables


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    names = ["nodes", "cross_visit", "path"]
    csvs = {n: args.csv.with_name(f"{args.csv.stem}.{n}{args.csv.suffix or '.csv'}")
            for n in names[1:]} if args.csv else {}  # fmt: skip
    check_outputs(
        {"MODEL": args.model},
        {"--json": args.json, "--csv": args.csv, **{f"--csv ({n})": p for n, p in csvs.items()}},
    )
    try:
        tables = tables_of(args)
    except argparse.ArgumentTypeError as exc:
        parser().error(str(exc))
    nodes = tables["nodes"]
    print(f"pair: {nodes.attrs['pair']}; metric: {args.metric}")
    for name, value in headline(nodes, tables["cross_visit"]):
        print(f"  {name}: {value:.4f}")
    fmt = lambda v: f"{v:.4f}"  # noqa: E731
    print(f"\ntop {args.top} nodes by activation patching:")
    print(top_nodes(nodes, args.top).to_string(index=False, float_format=fmt))
    if "path" in tables:
        print("\npath patching:")
        print(tables["path"].to_string(index=False, float_format=fmt))
    texts = {}
    if args.csv:
        texts[args.csv] = nodes.to_csv(index=False)
        texts.update({p: tables[n].to_csv(index=False) for n, p in csvs.items() if n in tables})
    if args.json:
        texts[args.json] = json_text({n: t.to_dict(orient="records") for n, t in tables.items()})
    atomic_write_many(texts)
    return 0


if __name__ == "__main__":
    run_cli(main)
