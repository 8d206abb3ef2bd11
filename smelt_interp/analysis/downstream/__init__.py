"""Downstream comparison of a Baseline/SMELT pair: the analyses (`compare`) and the command
(`python -m smelt_interp.analysis.downstream`, which runs smelt_interp.commands.downstream)."""

from smelt_interp.analysis.downstream.compare import (
    DEMO_COUNTS,
    DocumentScores,
    DownstreamReport,
    compare,
    compare_bytes,
    document_losses,
    dyck_examples_for,
    dyck_gap_by_demos,
    score_documents,
)
from smelt_interp.analysis.downstream.shards import compare_shards, score_shards

__all__ = [
    "DEMO_COUNTS",
    "DocumentScores",
    "DownstreamReport",
    "compare",
    "compare_bytes",
    "compare_shards",
    "document_losses",
    "dyck_examples_for",
    "dyck_gap_by_demos",
    "score_documents",
    "score_shards",
]
