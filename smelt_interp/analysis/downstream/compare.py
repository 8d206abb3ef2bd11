"""Downstream comparison of a Baseline/SMELT pair (paper section 5): relative cross-entropy
gain by domain and by sample length, and the Dyck accuracy gap by number of in-context
examples, each with bootstrap intervals over documents or examples (paired resampling). The
command is `python -m smelt_interp.analysis.downstream` (smelt_interp.commands.downstream)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from smelt_interp.analysis.resampling import check_resamples
from smelt_interp.data.corpora import Corpus
from smelt_interp.data.dyck import TASK_DYCK, DyckExample, DyckSpec, dyck_max_len, make_dataset
from smelt_interp.data.sources import load_source
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.errors import DataError
from smelt_interp.measure.dyck_score import teacher_forced_exact_match
from smelt_interp.measure.intervals import bootstrap_interval
from smelt_interp.model.transformer import SmeltModel, next_token_ce

DEMO_COUNTS = (0, 1, 2, 4)
# One resample of a statistic: 14 us measured over 64 documents (two shared cores); its value
# is kept as a Python float in a list (about 32 bytes).
SECONDS_PER_RESAMPLE = 14e-6
BYTES_PER_RESAMPLE = 32


@torch.no_grad()
def document_losses(
    model: SmeltModel, ids: torch.Tensor, lengths: torch.Tensor, batch_size: int = 16
) -> tuple[np.ndarray, np.ndarray]:
    """Summed next-token cross-entropy and predicted-token count per row (padding ignored)."""
    device = next(model.parameters()).device
    sums, counts = [], []
    for lo in range(0, ids.shape[0], batch_size):
        batch = ids[lo : lo + batch_size].to(device)
        valid = batch != PAD_ID
        sums.append(next_token_ce(model(batch), batch, valid).sum(1).cpu().numpy())
        counts.append(valid[:, 1:].sum(1).cpu().numpy())
    return np.concatenate(sums), np.concatenate(counts)


def _ratio_gain(base_sum: np.ndarray, smelt_sum: np.ndarray, counts: np.ndarray) -> float:
    """1 - CE_smelt / CE_base with token-weighted means."""
    return float(1.0 - smelt_sum.sum() / base_sum.sum()) if counts.sum() else float("nan")


@dataclass
class DocumentScores:
    """Per-document losses of both models, with domain and length."""

    table: pd.DataFrame  # columns: domain, n_tokens, base_sum, smelt_sum

    def gain_by(self, column: str, n_boot: int = 200, seed: int = 0) -> pd.DataFrame:
        rows = []
        for key, group in self.table.groupby(column, sort=True, observed=True):
            b, s, n = (group[c].to_numpy() for c in ("base_sum", "smelt_sum", "n_tokens"))
            lo, hi = bootstrap_interval(
                lambda i: _ratio_gain(b[i], s[i], n[i]), len(group), n_boot, seed
            )
            rows.append(
                {
                    column: key,
                    "n_docs": len(group),
                    "n_tokens": int(n.sum()),
                    "ce_baseline": b.sum() / n.sum(),
                    "ce_smelt": s.sum() / n.sum(),
                    "gain": _ratio_gain(b, s, n),
                    "gain_lo": lo,
                    "gain_hi": hi,
                }
            )
        return pd.DataFrame(rows)


def score_documents(
    base: SmeltModel, smelt: SmeltModel, corpus: Corpus, *, n_docs: int = 64, split: str = "heldout"
) -> DocumentScores:
    """Both models' losses on up to `n_docs` held-out documents per domain."""
    seq_len = min(base.cfg.max_seq_len, smelt.cfg.max_seq_len)
    frames = []
    for domain in corpus.domains:
        docs = sorted(corpus.select(domain, split), key=lambda d: d.id)[:n_docs]
        if not docs:
            continue
        ids, lengths = corpus.encode(docs, seq_len)
        b_sum, counts = document_losses(base, ids, lengths)
        s_sum, _ = document_losses(smelt, ids, lengths)
        frames.append(
            pd.DataFrame(
                {
                    "domain": domain,
                    "doc": [d.id for d in docs],
                    "n_tokens": counts,
                    "base_sum": b_sum,
                    "smelt_sum": s_sum,
                }
            )
        )
    if not frames:
        raise DataError(f"no {split} documents to score")
    table = pd.concat(frames, ignore_index=True)
    table = table[table["n_tokens"] > 0].reset_index(drop=True)
    table["length_bucket"] = length_buckets(table["n_tokens"])
    return DocumentScores(table)


BUCKET_EDGES = (0, 32, 64, 128, 256, 512, 1024, 1 << 20)


def length_buckets(counts: pd.Series | np.ndarray) -> pd.Categorical:
    """Each count's bucket of BUCKET_EDGES ('1-32', '33-64', ..., '>1024'): a document's
    length in tokens, or a token's position in its document."""
    edges = BUCKET_EDGES
    labels = [
        f"{edges[i] + 1}-{edges[i + 1]}" if i < len(edges) - 2 else f">{edges[i]}"
        for i in range(len(edges) - 1)
    ]
    return pd.cut(counts, list(edges), right=True, labels=labels)


def dyck_examples_for(
    model: SmeltModel,
    n_demos: int,
    n: int,
    seed: int,
    spec: DyckSpec = TASK_DYCK,
) -> list[DyckExample]:
    """Held-out in-context examples whose prompt fits the model: word length is capped so that
    n_demos + 1 examples of it, and the token after the answer, fit in max_seq_len."""
    cap = dyck_max_len(model.cfg.max_seq_len, n_demos, spec.max_len)
    if cap < 2:
        raise DataError(
            f"max_seq_len {model.cfg.max_seq_len} is too short for Dyck prompts with "
            f"{n_demos} demonstrations"
        )
    return make_dataset(
        n, spec=dataclasses.replace(spec, max_len=cap), n_demos=n_demos, seed=seed, split="heldout"
    )


def dyck_gap_by_demos(
    base: SmeltModel,
    smelt: SmeltModel,
    *,
    demos: Sequence[int] = DEMO_COUNTS,
    n: int = 200,
    n_boot: int = 200,
    seed: int = 0,
    spec: DyckSpec = TASK_DYCK,
) -> pd.DataFrame:
    """Exact-match accuracy of both models and the gap, per number of demonstrations."""
    rows = []
    for k in demos:
        examples = dyck_examples_for(base, k, n, seed + k, spec)
        hb = np.array(teacher_forced_exact_match(base, examples), dtype=float)
        hs = np.array(teacher_forced_exact_match(smelt, examples), dtype=float)
        lo, hi = bootstrap_interval(
            lambda i: float(hs[i].mean() - hb[i].mean()), len(examples), n_boot, seed
        )
        rows.append(
            {
                "n_demos": k,
                "n_examples": len(examples),
                "acc_baseline": hb.mean(),
                "acc_smelt": hs.mean(),
                "gap": hs.mean() - hb.mean(),
                "gap_lo": lo,
                "gap_hi": hi,
            }
        )
    return pd.DataFrame(rows)


@dataclass
class DownstreamReport:
    """The three tables; `length_key` names by_length's key column (`length_bucket`, a
    document's length, or on shards `position_bucket`, a token's position in its document)."""

    by_domain: pd.DataFrame
    by_length: pd.DataFrame
    by_demos: pd.DataFrame
    length_key: str = "length_bucket"

    def to_json(self) -> dict:
        return {
            name: json.loads(getattr(self, name).to_json(orient="records"))
            for name in ("by_domain", "by_length", "by_demos")
        }


def compare_bytes(
    max_seq_len: int, n_sources: int, n_docs: int, n_dyck: int, demos: Sequence[int] = DEMO_COUNTS
) -> int:
    """An estimate of the memory `compare` needs: the documents it loads (12 per scored one, as
    `compare` draws them, each up to a context of int64 ids and text) and the Dyck prompts."""
    rows = n_sources * max(n_docs * 12, 100) + n_dyck * len(demos)
    return rows * max_seq_len * 16


def compare(
    base: SmeltModel,
    smelt: SmeltModel,
    sources: Sequence[str] = ("code", "arith", "dyck"),
    *,
    n_docs: int = 64,
    n_dyck: int = 200,
    n_boot: int = 200,
    seed: int = 0,
) -> DownstreamReport:
    """All three analyses for one pair."""
    check_resamples(n_boot, SECONDS_PER_RESAMPLE, BYTES_PER_RESAMPLE, "a bootstrap of")
    corpus = Corpus(
        doc
        for spec in sources
        for doc in load_source(spec, seed=seed, n_docs=max(n_docs * 12, 100))
    )
    scores = score_documents(base, smelt, corpus, n_docs=n_docs)
    return DownstreamReport(
        scores.gain_by("domain", n_boot, seed),
        scores.gain_by("length_bucket", n_boot, seed),
        dyck_gap_by_demos(base, smelt, n=n_dyck, n_boot=n_boot, seed=seed),
    )
