"""Under torchrun (gloo): each rank reads its rows of micro-batches 0..N-1 of a prepared folder
and saves them as OUT/rank{r}.npy, for test_shards' disjoint-ranks check."""

from __future__ import annotations

import sys

import numpy as np
import torch.distributed as dist

from smelt_interp.data.shards import ShardSet
from smelt_interp.train.shard_loader import ShardBatches

folder, out, n_batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
loader = ShardBatches(
    ShardSet(folder), {"web": 2.0, "code": 1.0}, 32, 3, world=world, rank=rank, seed=5
)
rows = np.stack([loader.batch(u).numpy() for u in range(n_batches)])
np.save(f"{out}/rank{rank}.npy", rows)
dist.barrier()
dist.destroy_process_group()
