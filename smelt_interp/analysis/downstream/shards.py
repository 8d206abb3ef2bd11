"""The downstream comparison on a prepared folder's domains (`--shards DIR`): both models'
per-token losses on the held-out documents of every domain of the folder, each document one
row from its BOS cut to the shorter context, grouped by domain and by the target token's
position in its document (the length analysis: how much context a token had), with the same
paired bootstrap over documents as on the built-in sources. In-context examples come from the
Dyck prompts, which are spelled in bytes: a pair of byte models gets them, a BPE pair an empty
table (`dyck_gap_by_demos` is not mapped onto BPE ids)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from smelt_interp.analysis.downstream.compare import (
    DEMO_COUNTS,
    DocumentScores,
    DownstreamReport,
    dyck_gap_by_demos,
    length_buckets,
)
from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.shards import ShardSet
from smelt_interp.data.tokenizer import PAD_ID, ByteTokenizer
from smelt_interp.errors import DataError
from smelt_interp.model.transformer import SmeltModel, next_token_ce

DEMO_COLUMNS = ["n_demos", "n_examples", "acc_baseline", "acc_smelt", "gap", "gap_lo", "gap_hi"]


def heldout_documents(
    shards: ShardSet, domain: str, n_docs: int, seq_len: int
) -> tuple[list[str], torch.Tensor]:
    """(ids of the documents, rows [n, seq_len]): the first `n_docs` held-out documents of
    `domain` in shard order, each BOS-led and cut to `seq_len`, right-padded with PAD."""
    names, rows = [], []
    for shard in shards.select(domain, "heldout"):
        for i in range(len(shard)):
            if len(rows) == n_docs:
                break
            doc = shard.document(i)[:seq_len].astype(np.int64)
            rows.append(np.pad(doc, (0, seq_len - len(doc)), constant_values=PAD_ID))
            names.append(f"{shard.path.name}:{i}")
    if not rows:
        raise DataError(f"domain {domain!r} has no held-out documents in {shards.folder}")
    return names, torch.from_numpy(np.stack(rows))


@torch.no_grad()
def token_losses(model: SmeltModel, ids: torch.Tensor, batch_size: int = 16) -> np.ndarray:
    """Next-token cross-entropy of every target [n, seq_len - 1]; 0 where the target is PAD."""
    device = next(model.parameters()).device
    out = []
    for lo in range(0, ids.shape[0], batch_size):
        batch = ids[lo : lo + batch_size].to(device)
        out.append(next_token_ce(model(batch), batch, batch != PAD_ID).double().cpu().numpy())
    return np.concatenate(out)


def score_shards(
    base: SmeltModel, smelt: SmeltModel, shards: ShardSet, *, n_docs: int = 64
) -> tuple[DocumentScores, DocumentScores]:
    """Per-document and per-(document, position bucket) loss sums of both models on up to
    `n_docs` held-out documents of each domain: (documents with domain and length_bucket,
    document parts with position_bucket, a target's 1-based position in its document)."""
    seq_len = min(base.cfg.max_seq_len, smelt.cfg.max_seq_len)
    docs, parts = [], []
    for domain in shards.domains("heldout"):
        names, ids = heldout_documents(shards, domain, n_docs, seq_len)
        valid = (ids[:, 1:] != PAD_ID).numpy()
        b, s = token_losses(base, ids), token_losses(smelt, ids)
        n_tokens = valid.sum(1)
        docs.append(
            pd.DataFrame(
                {
                    "domain": domain,
                    "doc": names,
                    "n_tokens": n_tokens,
                    "base_sum": b.sum(1),
                    "smelt_sum": s.sum(1),
                }
            )
        )
        bucket = np.asarray(length_buckets(np.arange(1, seq_len)).codes)
        for code in np.unique(bucket):
            cols = bucket == code
            parts.append(
                pd.DataFrame(
                    {
                        "domain": domain,
                        "doc": names,
                        "position_code": code,
                        "n_tokens": valid[:, cols].sum(1),
                        "base_sum": b[:, cols].sum(1),
                        "smelt_sum": s[:, cols].sum(1),
                    }
                )
            )
    table = pd.concat(docs, ignore_index=True)
    table = table[table["n_tokens"] > 0].reset_index(drop=True)
    table["length_bucket"] = length_buckets(table["n_tokens"])
    by_part = pd.concat(parts, ignore_index=True)
    by_part = by_part[by_part["n_tokens"] > 0].reset_index(drop=True)
    labels = length_buckets(np.arange(1, seq_len)).categories
    by_part["position_bucket"] = pd.Categorical.from_codes(by_part["position_code"], labels)
    return DocumentScores(table), DocumentScores(by_part.drop(columns="position_code"))


def compare_shards(
    base: SmeltModel,
    smelt: SmeltModel,
    shards: ShardSet,
    tokenizer: Tokenizer,
    *,
    n_docs: int = 64,
    n_dyck: int = 200,
    n_boot: int = 200,
    seed: int = 0,
    demos: Sequence[int] = DEMO_COUNTS,
) -> DownstreamReport:
    """Gain by domain and by position in the document on the folder's held-out documents, and
    the Dyck gap by in-context examples when the pair reads bytes (`tokenizer`)."""
    docs, positions = score_shards(base, smelt, shards, n_docs=n_docs)
    if isinstance(tokenizer, ByteTokenizer) and n_dyck > 0:
        by_demos = dyck_gap_by_demos(base, smelt, demos=demos, n=n_dyck, n_boot=n_boot, seed=seed)
    else:
        by_demos = pd.DataFrame(columns=DEMO_COLUMNS)
    return DownstreamReport(
        docs.gain_by("domain", n_boot, seed),
        positions.gain_by("position_bucket", n_boot, seed),
        by_demos,
        length_key="position_bucket",
    )
