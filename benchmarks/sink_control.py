"""The attention-sink positive control's lab: train one model on trigger rows (Bigram-Backcopy in
the spirit of Guo et al. 2024) and record the sink's onset curve, one JSON line per evaluation.

    python -m benchmarks.sink_control NAME [--preset sink-control] [--set KEY=VALUE ...]
        [--tokens 5e6] [--every 20] [--out runs/sink_control]

Each line: step, tokens, seconds, train loss, and per attention head (layer.head) on held-out
rows of the run's own trigger spec: `bos` (mean attention on key 0 at queries i >= 1 whose token
is not a trigger: where the head has nothing to copy), `prev_trig` (attention on the previous
token at trigger queries: the copy), `vratio` (|v| at BOS over the mean |v| elsewhere) and
`copy_acc` (greedy accuracy of the token after a trigger). The lines go to
<out>/<NAME>/onset.jsonl and to stdout. Run it with OMP_NUM_THREADS=1 for the figures in
docs/results/sink_control.md (a run's thread count is part of its record)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from smelt_interp.data.trigger import answer_positions, trigger_rows
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.train.build import build_config
from smelt_interp.train.trainer import Trainer

HELDOUT_ROWS = 32


@torch.no_grad()
def onset_point(model: SmeltModel, rows: torch.Tensor) -> dict[str, dict[str, float] | float]:
    """Per head (keys "layer.head") BOS mass at non-trigger queries, previous-token mass at
    trigger queries and the BOS value-norm ratio; and the copy accuracy after triggers."""
    patterns: dict[str, torch.Tensor] = {}
    values: dict[str, torch.Tensor] = {}

    def keep(store: dict[str, torch.Tensor]):
        def hook(t: torch.Tensor, hook) -> None:
            store[hook.name] = t.double()

        return hook

    hooks = [(n, keep(patterns)) for n in model.hook_names("attn.hook_pattern")]
    hooks += [(n, keep(values)) for n in model.hook_names("attn.hook_v")]
    was_training = model.training
    model.eval()
    logits = model.run_with_hooks(rows, fwd_hooks=hooks)
    model.train(was_training)
    trig = answer_positions(rows)  # [b, T]: the query is a trigger (the next token is a copy)
    rest = ~trig
    rest[:, 0] = False
    heads: dict[str, dict[str, float]] = {}
    group = model.cfg.n_group
    for (layer, visit), p_name, v_name in zip(
        model.schedule,
        model.hook_names("attn.hook_pattern"),
        model.hook_names("attn.hook_v"),
        strict=True,
    ):
        pattern, v = patterns[p_name], values[v_name]  # [b, H, T, T], [b, T, kv, d]
        prev = torch.diagonal(pattern, offset=-1, dim1=-2, dim2=-1)  # [b, H, T - 1]: i -> i - 1
        norms = v.norm(dim=-1)  # [b, T, kv]
        v_bos, v_rest = norms[:, 0].mean(0), norms[:, 1:].mean((0, 1))
        for head in range(pattern.shape[1]):
            key = (
                f"{layer}.{head}"
                if len(model.cfg.looped_layers) == 0
                else f"{layer}.{visit}.{head}"
            )
            heads[key] = {
                "bos": float(pattern[:, head, :, 0][rest].mean()),
                "prev_trig": float(prev[:, head][trig[:, 1:]].mean()),
                "vratio": float(v_bos[head // group] / v_rest[head // group]),
            }
    at = trig[:, :-1]
    copy_acc = float((logits[:, :-1].argmax(-1)[at] == rows[:, 1:][at]).double().mean())
    return {"heads": heads, "copy_acc": copy_acc}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("name")
    p.add_argument("--preset", default="sink-control")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--tokens", type=float, default=5e6, help="stop after this many tokens")
    p.add_argument("--every", type=int, default=20, help="evaluate every this many steps")
    p.add_argument("--out", default="runs/sink_control")
    args = p.parse_args(argv)
    cfg = build_config(args.preset, None, args.overrides)
    out = Path(args.out) / args.name
    out.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(cfg, out, progress=False)
    rows = trigger_rows(
        HELDOUT_ROWS, cfg.batch.seq_len, seed=cfg.seed, split="heldout", spec=cfg.corpus.trigger
    )
    steps = min(cfg.schedule.steps, int(args.tokens // trainer.tokens_per_step))
    schedule = cfg.lr_schedule(cfg.schedule.steps)
    start, losses = time.perf_counter(), []
    with open(out / "onset.jsonl", "w", encoding="utf-8") as log:
        log.write(json.dumps({"config": cfg.to_dict(), "threads": torch.get_num_threads()}) + "\n")
        while trainer.step < steps:
            losses.append(trainer.train_step(schedule(trainer.step))["loss"])
            if trainer.step % args.every and trainer.step != steps:
                continue
            point = onset_point(trainer.model, rows.to(trainer.device))
            recent = losses[-args.every :]
            record = {
                "step": trainer.step,
                "tokens": trainer.step * trainer.tokens_per_step,
                "seconds": round(time.perf_counter() - start, 1),
                "loss": round(float(sum(float(x) for x in recent) / len(recent)), 4),
                **point,
            }
            log.write(json.dumps(record) + "\n")
            log.flush()
            brief = " ".join(
                f"{k} bos {h['bos']:.3f} prev {h['prev_trig']:.2f} v {h['vratio']:.2f}"
                for k, h in record["heads"].items()
            )
            print(
                f"{record['step']} {record['tokens'] / 1e6:.2f}M {record['seconds']}s "
                f"loss {record['loss']:.3f} copy {record['copy_acc']:.2f} | {brief}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
