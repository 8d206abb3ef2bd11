"""A worker script `tests/train/test_fsdp.py` runs under torchrun: trains each asked architecture
with
the Trainer in one process group, then (with --logits) saves the sharded model's logits on a few
rows per rank, gathered on rank 0. With --kill-at STEP every rank SIGKILLs itself when it is about
to train that step: a crash, with nothing flushed or cleaned up.

    torchrun ... tests/helpers/fsdp_worker.py OUT CONFIG_JSON [--archs baseline,smelt] [--resume]
        [--kill-at STEP] [--logits]"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist

from smelt_interp.train.config import TrainConfig
from smelt_interp.train.parallel import local
from smelt_interp.train.trainer import Trainer

LOGIT_ROWS = 2  # per rank
LOGIT_LEN = 24


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("config")
    p.add_argument("--archs", default="baseline")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--kill-at", type=int)
    p.add_argument("--logits", action="store_true")
    args = p.parse_args()
    base = TrainConfig.from_dict(json.loads(args.config))
    if args.kill_at is not None:
        original = Trainer.train_step

        def dying_step(self: Trainer, lr: float) -> dict[str, float]:
            if self.step == args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, lr)

        Trainer.train_step = dying_step  # type: ignore[method-assign]
    for arch in args.archs.split(","):
        trainer = Trainer(
            base.with_overrides({"arch": arch}),
            Path(args.out) / arch,
            resume=args.resume,
            progress=False,
        )
        trainer.run()
        if args.logits:
            save_logits(trainer, Path(args.out) / arch / "logits.pt")


@torch.no_grad()
def save_logits(trainer: Trainer, path: Path) -> None:
    """Each rank runs its own rows through the sharded model; rank 0 saves all rows' tokens and
    logits, and how many parameter values it held against the model's total."""
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(100 + rank)
    vocab = trainer.model_cfg.vocab_size
    tokens = torch.randint(0, vocab, (LOGIT_ROWS, LOGIT_LEN), generator=gen)
    trainer.model.eval()
    logits = trainer.model(tokens).float().contiguous()
    gathered = [torch.empty_like(logits) for _ in range(world)]
    dist.all_gather(gathered, logits)
    every_tokens = [torch.empty_like(tokens) for _ in range(world)]
    dist.all_gather(every_tokens, tokens)
    if rank == 0:
        params = list(trainer.model.parameters())
        saved = {
            "tokens": torch.cat(every_tokens),
            "logits": torch.cat(gathered),
            "local_numel": sum(local(p).numel() for p in params),
            "full_numel": sum(p.numel() for p in params),
        }
        torch.save(saved, path)


if __name__ == "__main__":
    main()
