"""`python -m smelt_interp.train eval CKPT --shards DIR`: the held-out loss of every domain of
a prepared folder equals a slow float64 recomputation from the shard files, and a folder of
another tokenizer is one `error:` line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.bad_input import assert_one_line_error, run_command
from helpers.bpe_models import prepared_bpe_shards, trained_on_shards

from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.data.prepare import prepare
from smelt_interp.data.shards import HEADER_BYTES, ShardSet
from smelt_interp.data.tokenizer import BOS_ID, PAD_ID

ROW = 32  # the run's seq_len


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eval_shards")
    shards = prepared_bpe_shards(root)
    return {"shards": shards, "ckpt": trained_on_shards(shards, root / "run"), "root": root}


def slow_rows(path: Path, n_tokens: int, dtype: str, starts: set[int]) -> list[list[int]]:
    """A shard's rows from its raw bytes: a row begins at a document's BOS and takes ROW
    tokens, or begins inside a document and is BOS and the next ROW - 1 tokens."""
    tokens = np.fromfile(path, dtype=dtype, count=n_tokens, offset=HEADER_BYTES).tolist()
    rows, p = [], 0
    while p < len(tokens):
        if p in starts:
            row, p = tokens[p : p + ROW], p + ROW
        else:
            row, p = [BOS_ID, *tokens[p : p + ROW - 1]], p + ROW - 1
        rows.append(row + [PAD_ID] * (ROW - len(row)))
    return rows


def slow_loss(model, rows: list[list[int]]) -> float:
    """Mean next-token cross-entropy in float64 over every non-PAD target, row by row."""
    total, count = 0.0, 0
    for row in rows:
        ids = torch.tensor([row])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids)[0].double(), dim=-1)
        for t in range(1, ROW):
            if row[t] != PAD_ID:
                total -= float(logp[t - 1, row[t]])
                count += 1
    return total / count


def test_eval_shards_loss_per_domain_equals_a_slow_float64_recomputation(run, tmp_path):
    out = tmp_path / "eval.json"
    code, stdout, err = run_command(
        "smelt_interp.train",
        "eval",
        run["ckpt"],
        "--shards",
        run["shards"],
        "--n",
        "0",
        "--loss-rows",
        "1000",
        "--json",
        out,
    )
    assert code == 0, err
    report = json.loads(out.read_text())[0]
    model, _ = load_checkpoint(run["ckpt"])
    shard_set = ShardSet(run["shards"])
    domains = shard_set.domains("heldout")
    assert domains == ["code", "prose"]
    for domain in domains:
        rows = []
        for shard in shard_set.select(domain, "heldout"):
            h = shard.header
            starts = set(np.asarray(shard.offsets[:-1]).tolist())
            rows += slow_rows(shard.path, h.n_tokens, h.dtype, starts)
        assert report[f"loss/{domain}"] == pytest.approx(slow_loss(model, rows), rel=1e-5)
        assert f"loss/{domain}" in stdout
    assert report["shards"] == str(run["shards"])
    assert "user_data_not_read" not in report


def test_eval_refuses_shards_of_another_tokenizer(run, tmp_path):
    other = tmp_path / "bytes_shards"
    prepare([f"code={run['root'] / 'code.jsonl'}"], other, "bytes")
    code, _, err = run_command("smelt_interp.train", "eval", run["ckpt"], "--shards", other)
    assert_one_line_error(code, err, "tokenizer")
