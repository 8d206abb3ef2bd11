"""Where a recall model's heads put their attention when they have nothing to retrieve: at the
non-answer positions of held-out rows (data.assoc_recall.recall_positions), each head's mass on
BOS and on the keys that hold one of the row's recall triggers, beside uniform attention's.

BOS is not the only key an idle head can park on. With one trigger byte shared by every row,
the trigger positions are a second key of constant content (about a fifth of the keys); the
table shows whether a run's heads parked there instead: one row per run (its final
checkpoint) or checkpoint file, a cell per head, on rows of the run's own task and row length.

    python -m benchmarks.recall_idle_keys runs/recall-v/*/baseline [--rows 64] [--layers 1,2]
    python -m benchmarks.recall_idle_keys runs/recall-v/course_s101/baseline/early/ckpt-*.pt"""

from __future__ import annotations

from pathlib import Path

import torch

from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.cli import ArgumentParser, int_at_least, run_cli
from smelt_interp.data.assoc_recall import recall_positions, recall_rows
from smelt_interp.measure.batching import inference
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.train.config import TrainConfig

HELD_OUT_SEED = 12345  # the rows every recall sweep measure is read on (recall_sweep.md)


def idle_masses(
    model: SmeltModel, rows: torch.Tensor, trigger_ids: tuple[int, ...]
) -> dict[str, tuple[float, float, float, float]]:
    """Per head `L.V.H`: (BOS, trigger keys, uniform BOS, uniform trigger keys), means over the
    non-answer queries of `rows` [b, T]; float64 sums."""
    non_answer = recall_positions(rows, trigger_ids).non_answer  # [b, T]
    is_trigger = torch.isin(rows, torch.tensor(trigger_ids)).double()  # [b, T] keys
    is_trigger[:, 0] = 0.0
    t = rows.shape[1]
    seen = torch.tril(torch.ones(t, t, dtype=torch.float64))  # [q, k]: k <= q
    trig_seen = torch.einsum("qk,bk->bq", seen, is_trigger)  # trigger keys visible at q
    n_keys = torch.arange(1, t + 1, dtype=torch.float64)
    weight = non_answer.double()
    count = weight.sum()
    uniform_bos = float((weight / n_keys).sum() / count)
    uniform_trig = float((weight * trig_seen / n_keys).sum() / count)
    patterns: dict[str, torch.Tensor] = {}

    def grab(pattern: torch.Tensor, hook) -> None:
        patterns[hook.name] = pattern.double()

    names = model.hook_names("attn.hook_pattern")
    with inference(model):
        model.run_with_hooks(rows, fwd_hooks=[(name, grab) for name in names])
    out = {}
    for layer, visit in model.schedule:
        name = model.hook_name(layer, visit, "attn.hook_pattern")
        pattern = patterns[name]  # [b, H, q, k]
        bos = (pattern[..., 0] * weight[:, None]).sum((0, 2)) / count
        trig = (torch.einsum("bhqk,bk->bhq", pattern, is_trigger) * weight[:, None]).sum((0, 2))
        for h in range(pattern.shape[1]):
            key = f"{layer}.{visit}.{h}"
            out[key] = (float(bos[h]), float(trig[h] / count), uniform_bos, uniform_trig)
    return out


def label(path: Path) -> str:
    """`name/arch` of the run a folder or checkpoint belongs to (the folder with its log)."""
    folder = next((p for p in (path, *path.parents) if (p / "metrics.jsonl").exists()), path)
    return f"{folder.parent.name}/{folder.name}"


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run folders holding ckpt.pt, or checkpoints")
    p.add_argument("--rows", type=int_at_least(1), default=64, help="held-out rows a run")
    p.add_argument("--layers", default="", help="only these layers, e.g. 1,2 (default all)")
    args = p.parse_args(argv)
    layers = {int(x) for x in args.layers.split(",") if x}
    header: list[str] = []
    for run in args.runs:
        model, info = load_checkpoint(run / "ckpt.pt" if run.is_dir() else run)
        cfg = TrainConfig.from_dict(info.train_config)
        spec = cfg.corpus.assoc_recall
        rows = recall_rows(args.rows, cfg.batch.seq_len, HELD_OUT_SEED, split="heldout", spec=spec)
        masses = idle_masses(model, rows, spec.trigger_ids)
        heads = [key for key in masses if not layers or int(key.split(".")[0]) in layers]
        if heads != header:  # a table per head layout; runs of one preset share one
            header = heads
            cols = [f"{key} BOS / trigger keys" for key in heads]
            cols += ["uniform BOS / trigger keys"]
            print("| run | " + " | ".join(cols) + " |")
            print("|---" * (len(cols) + 1) + "|")
        name = label(run) + (f" step {info.step}" if run.is_file() else "")
        cells = [f"{masses[key][0]:.2f} / {masses[key][1]:.2f}" for key in heads]
        u_bos, u_trig = next(iter(masses.values()))[2:]
        cells.append(f"{u_bos:.2f} / {u_trig:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    run_cli(main)
