"""Training throughput of the associative-recall pair (`recall-pair`: 256-token BOS-led rows,
d_model 64, 2 heads a layer) against the default pair (`dyck-pair`), both architectures, eager,
side by side in one process (interleaved rounds, median; pair_bench's measurement), with the
recall / Dyck ratio of tokens/s for each architecture. Tokens are the rows' real tokens (PAD
excluded); the data pipeline's time per step is shown beside.

python -m benchmarks.recall_bench [--steps N] [--rounds R] [--threads 2] [--quick]
    [--results OUT.md]"""

from __future__ import annotations

from benchmarks import pair_bench

PAIRS = ("dyck-pair", "recall-pair")


def main(argv: list[str] | None = None) -> None:
    # 32 measured steps a model
    pair_bench.main(argv, pairs=PAIRS, steps=8, rounds=4, module="benchmarks.recall_bench")


if __name__ == "__main__":
    main()
