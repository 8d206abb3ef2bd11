"""The downstream comparison on a prepared folder (`--shards DIR`): gain by domain and by a
token's position in its document equal a slow float64 computation over the held-out
documents, a BPE pair has no in-context Dyck table, and a BPE pair on byte sources is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.bad_input import assert_one_line_error, run_command
from helpers.bpe_models import prepared_bpe_shards, tiny_checkpoint

from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.data.shards import ShardSet

N_DOCS = 5
CONTEXT = 64  # the tiny models' max_seq_len


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("downstream_shards")
    shards = prepared_bpe_shards(root)
    tok = ShardSet(shards).tokenizer
    return {
        "shards": shards,
        "baseline": tiny_checkpoint(root / "b.pt", tok, looped=False, seed=1),
        "smelt": tiny_checkpoint(root / "s.pt", tok, seed=2),
    }


def slow_token_losses(model, doc: list[int]) -> list[float]:
    """-log p(doc[t] | doc[:t]) for t = 1.. in float64, one prefix at a time."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([doc]))[0].double(), dim=-1)
    return [-float(logp[t - 1, doc[t]]) for t in range(1, len(doc))]


def test_gain_by_domain_and_position_equal_a_slow_computation(pair, tmp_path):
    out = tmp_path / "d.json"
    code, stdout, err = run_command(
        "smelt_interp.analysis.downstream",
        pair["baseline"],
        pair["smelt"],
        "--shards",
        pair["shards"],
        "--n-docs",
        N_DOCS,
        "--bootstrap",
        20,
        "--json",
        out,
    )
    assert code == 0, err
    report = json.loads(out.read_text())
    base, _ = load_checkpoint(pair["baseline"])
    smelt, _ = load_checkpoint(pair["smelt"])
    shard_set = ShardSet(pair["shards"])
    by_position: dict[str, list[float]] = {}  # bucket -> [base sum, smelt sum, count]
    rows = {r["domain"]: r for r in report["by_domain"]}
    assert set(rows) == {"code", "prose"}
    for domain in ("code", "prose"):
        docs = [
            shard.document(i).tolist()[:CONTEXT]
            for shard in shard_set.select(domain, "heldout")
            for i in range(len(shard))
        ][:N_DOCS]
        b_sum = s_sum = 0.0
        count = 0
        for doc in docs:
            b, s = slow_token_losses(base, doc), slow_token_losses(smelt, doc)
            b_sum, s_sum, count = b_sum + sum(b), s_sum + sum(s), count + len(b)
            for t, (bt, st) in enumerate(zip(b, s), start=1):
                bucket = by_position.setdefault("1-32" if t <= 32 else "33-64", [0.0, 0.0, 0])
                bucket[0] += bt
                bucket[1] += st
                bucket[2] += 1
        row = rows[domain]
        assert row["n_docs"] == len(docs) and row["n_tokens"] == count
        assert row["ce_baseline"] == pytest.approx(b_sum / count, rel=1e-5)
        assert row["ce_smelt"] == pytest.approx(s_sum / count, rel=1e-5)
        assert row["gain"] == pytest.approx(1 - s_sum / b_sum, rel=1e-4, abs=1e-6)
    got = {r["position_bucket"]: r for r in report["by_length"]}
    assert set(got) == set(by_position)
    for bucket, (b_sum, s_sum, count) in by_position.items():
        assert got[bucket]["n_tokens"] == count
        assert got[bucket]["gain"] == pytest.approx(1 - s_sum / b_sum, rel=1e-4, abs=1e-6)
        assert got[bucket]["gain_lo"] <= got[bucket]["gain_hi"]
    assert report["by_demos"] == []
    assert "Dyck prompts are spelled in bytes" in stdout
    assert np.isfinite([r["gain"] for r in report["by_length"]]).all()


def test_a_bpe_pair_on_byte_sources_is_one_line(pair):
    code, _, err = run_command(
        "smelt_interp.analysis.downstream", pair["baseline"], pair["smelt"], "--n-docs", 2
    )
    assert_one_line_error(code, err, "--shards")
