"""A causal test of what decides the recall Baseline's sink: train it with the recall-trigger keys
hidden from the attention of layers 1 and up, so the one other key of constant content that an
idle head parks on (benchmarks.recall_idle_keys) is gone, and BOS is left as the only one.

Retrieval does not need those keys: an answer position reads the successors (the keys after the
earlier occurrences), and layer 0, which copies each trigger into its successor's residual
stream, still sees them. Hiding a key set is its softmax with those keys removed: the pattern
with their columns zeroed and each row renormalized, applied during training and in the
evaluation alike (a permanent hook on each visit's `attn.hook_pattern`, so those visits take
the explicit attention path). The trainer's own evaluation reads masses from Q and K with every
key visible, so it does not see the hiding; this lab keeps a checkpoint every evaluation and
measures each one with the keys hidden (benchmarks.recall_idle_keys.idle_masses on 64 held-out
rows), writing OUT/ARCH/onset.jsonl and printing one onset row.

    python -m benchmarks.recall_hidden_triggers runs/recall-v/hide_s100 --set seed=100 \\
        [--arch smelt] [--preset recall-pair] [--from-layer 1] [--at 0.5,1,2,3,4]"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks.recall_idle_keys import HELD_OUT_SEED, idle_masses
from benchmarks.sink_control_table import at_or_after
from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.cli import ArgumentParser, int_at_least, run_cli
from smelt_interp.commands.seeds import run_state
from smelt_interp.config import BASELINE
from smelt_interp.data.assoc_recall import recall_rows
from smelt_interp.errors import RunFolderError
from smelt_interp.measure.sink import best_held
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.train.build import build_config
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import PAIR
from smelt_interp.train.run_folder import KEPT_PATTERN
from smelt_interp.train.trainer import Trainer, pair_configs


def hide_keys(pattern: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """`pattern` [b, h, q, k] with the keys where `hidden` [b, k] is True removed: their mass
    set to 0 and each query's row renormalized (BOS is never hidden, so no row empties)."""
    kept = pattern * (~hidden)[:, None, None, :]
    return kept / kept.sum(dim=-1, keepdim=True)


def install(model: SmeltModel, trigger_ids: tuple[int, ...], from_layer: int) -> None:
    """Permanent hooks on `model`: the batch's tokens are kept at each forward, and every visit
    of layers >= `from_layer` attends with the recall-trigger keys hidden. Whole rows only: a
    forward over a KV cache sees only its new tokens, so cached keys would not be hidden."""
    ids = torch.tensor(trigger_ids)
    state: dict[str, torch.Tensor] = {}

    forward = model.forward

    def forward_keeping_tokens(tokens: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        hidden = torch.isin(tokens, ids.to(tokens.device))
        hidden[:, 0] = False
        state["hidden"] = hidden
        return forward(tokens, *args, **kwargs)

    def hide(pattern: torch.Tensor, hook) -> torch.Tensor:
        hidden = state["hidden"]
        return hide_keys(pattern, hidden[:, -pattern.shape[-1] :])

    # An instance attribute, so run_with_hooks (which calls .forward, not the module) sees it too
    model.forward = forward_keeping_tokens
    for layer, visit in model.schedule:
        if layer >= from_layer:
            point = model.hook_dict[model.hook_name(layer, visit, "attn.hook_pattern")]
            point.add_hook(hide, is_permanent=True)


HIDING_FILE = "hidden_keys.json"  # what the lab hid while training the run in this folder


def check_hiding(run: Path, hiding: dict) -> None:
    """Refuse a folder holding a run this lab did not train, or trained hiding other keys: its
    checkpoints would be measured under a hiding they were not trained with."""
    if not run.exists() or not any(run.iterdir()):
        return
    marker = run / HIDING_FILE
    if not marker.is_file():
        raise RunFolderError(f"{run} holds a run this lab did not train; choose another folder")
    try:
        saved = json.loads(marker.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RunFolderError(f"{marker} is not this lab's record; choose another folder") from None
    if saved != hiding:
        raise RunFolderError(
            f"{run} was trained hiding {saved}, not {hiding}; choose another folder"
        )


def onset(run: Path, cfg: TrainConfig, from_layer: int, rows: int = 64) -> list[dict]:
    """Per evaluation's checkpoint, in step order: {step, tokens, bos: {head: mass}},
    each head's BOS mass at non-answer positions with the trigger keys hidden."""
    spec = cfg.corpus.assoc_recall
    held_out = recall_rows(rows, cfg.batch.seq_len, HELD_OUT_SEED, split="heldout", spec=spec)
    paths = sorted(p for p in run.rglob("ckpt-*.pt") if KEPT_PATTERN.match(p.name))
    points = {}
    for path in [*paths, run / "ckpt.pt"]:
        model, info = load_checkpoint(path)
        install(model, spec.trigger_ids, from_layer)
        masses = idle_masses(model, held_out, spec.trigger_ids)
        tokens = info.step * cfg.batch.size * cfg.batch.seq_len
        bos = {head: m[0] for head, m in masses.items()}
        points[info.step] = {"step": info.step, "tokens": tokens, "bos": bos}
    return [points[step] for step in sorted(points)]


def onset_row(name: str, points: list[dict], at: list[float]) -> str:
    """One Markdown row: the held head's BOS at each --at token count, at the end, held."""
    last = points[-1]
    head, held = best_held({h: [p["bos"][h] for p in points] for h in last["bos"]})
    if head == "none":  # too few evaluations to hold anything: follow the last one's top head
        head = max(last["bos"], key=last["bos"].__getitem__)
    cells = []
    for m in at:
        point = at_or_after(points, m)
        cells.append("-" if point is None else f"{point['bos'][head]:.2f}")
    tail = [f"{last['tokens'] / 1e6:.1f}M: {last['bos'][head]:.2f}", f"{held:.2f}", head]
    return f"| {name} | " + " | ".join(cells + tail) + " |"


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="run folder (the model trains into OUT/ARCH)")
    p.add_argument("--arch", choices=PAIR, default=BASELINE, help="which model of the pair")
    p.add_argument("--preset", default="recall-pair")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--from-layer", type=int_at_least(0), default=1, help="hide the keys from this layer on"
    )
    p.add_argument("--at", default="0.5,1,2,3,4", help="token counts, in millions")
    args = p.parse_args(argv)
    cfg = pair_configs(build_config(args.preset, None, args.overrides))[args.arch]
    # a checkpoint at every evaluation, all kept: the lab measures each one with the keys hidden
    keep = {"keep_ckpts_until": cfg.schedule.steps, "ckpt_every": cfg.eval.every}
    cfg = cfg.with_overrides(keep)
    run = args.out / args.arch
    hiding = {
        "trigger_ids": list(cfg.corpus.assoc_recall.trigger_ids),
        "from_layer": args.from_layer,
    }
    check_hiding(run, hiding)
    state = run_state(run, cfg)  # a run of another config is refused; a killed one resumes
    if state != "complete":
        run.mkdir(parents=True, exist_ok=True)
        (run / HIDING_FILE).write_text(json.dumps(hiding) + "\n")
        trainer = Trainer(cfg, run, resume=state == "resumable", progress=False)
        install(trainer.model, cfg.corpus.assoc_recall.trigger_ids, args.from_layer)
        trainer.run()
    points = onset(run, cfg, args.from_layer)
    (run / "onset.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    print(onset_row(args.out.name, points, [float(x) for x in args.at.split(",")]))
    return 0


if __name__ == "__main__":
    run_cli(main)
