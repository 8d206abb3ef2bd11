"""Token shards end to end: prepare (bytes and BPE) -> shards -> rows, against the source
documents; BOS-led rows, disjoint splits and ranks, exact resume, and bad input as one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers.torchrun import REPO, torchrun_run

from smelt_interp.data.bpe import BpeTokenizer, read_tokenizer, train_bpe
from smelt_interp.data.documents import split_of
from smelt_interp.data.prepare import prepare
from smelt_interp.data.shards import (
    HEADER_BYTES,
    MANIFEST,
    TOKENIZER_FILE,
    DomainRows,
    Shard,
    ShardError,
    ShardSet,
    heldout_mix,
    row_plan,
)
from smelt_interp.data.tokenizer import BOS_ID, PAD_ID
from smelt_interp.errors import DataError, TokenizerError
from smelt_interp.train.shard_loader import ShardBatches, domain_counts

ROW = 32


def corpus_texts() -> list[str]:
    """Multi-byte characters, empty documents and documents longer than several rows."""
    texts = ["", "héllo wörld — 日本語 🙂", "a", ""]
    texts += [f"line {i}: ünïcödé ✓ {'x' * (i % 7)}\n" * (1 + i % 9) for i in range(80)]
    texts += ["🙂日本" * 60, "long document " * 40]
    return texts


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("src")
    web = root / "web.jsonl"
    web.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus_texts()))
    code = root / "code.parquet"
    pq.write_table(
        pa.table({"text": [f"def f{i}(x):\n    return x * {i}\n" for i in range(40)]}), code
    )
    return {"web": web, "code": code, "root": root}


def expected_docs(sources) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for i, text in enumerate(corpus_texts(), start=1):
        out.setdefault(("web", split_of(f"web.jsonl:{i}")), []).append(text)
    for i in range(40):
        text = f"def f{i}(x):\n    return x * {i}\n"
        out.setdefault(("code", split_of(f"code.parquet:{i}")), []).append(text)
    return out


@pytest.fixture(scope="module", params=["bytes", "bpe"])
def prepared(request, sources, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prep") / request.param
    spec = "bytes" if request.param == "bytes" else "bpe:320"
    specs = [f"web={sources['web']}", f"code={sources['code']}"]
    prepare(specs, out, spec, shard_tokens=400)
    return out


def decode_docs(shard_set: ShardSet, domain: str, split: str) -> list[str]:
    tok = shard_set.tokenizer
    docs = []
    for shard in shard_set.select(domain, split):
        for ids in shard.documents():
            assert ids[0] == BOS_ID
            docs.append(tok.decode(ids[1:].tolist()))
    return docs


def rows_to_docs(rows: DomainRows, tok) -> list[str]:
    """Documents rebuilt from every row of the plan: a continuation row's BOS is dropped, and
    the joined stream split at BOS."""
    stream: list[int] = []
    for k in range(len(rows)):
        row = rows.rows(np.array([k]))[0]
        _, start, continued = rows.plan[k]
        body = row[1:] if continued else row
        stream.extend(int(t) for t in body if t != PAD_ID)
    assert stream[0] == BOS_ID
    docs, cur = [], None
    for t in stream:
        if t == BOS_ID:
            if cur is not None:
                docs.append(tok.decode(cur))
            cur = []
        else:
            cur.append(t)
    docs.append(tok.decode(cur))
    return docs


def test_round_trip_documents_and_rows(prepared, sources):
    shard_set = ShardSet(prepared)
    want = expected_docs(sources)
    assert sorted(shard_set.shards) == sorted(want)
    for (domain, split), docs in want.items():
        assert decode_docs(shard_set, domain, split) == docs
        rows = DomainRows(shard_set.select(domain, split), ROW, PAD_ID)
        # rows of each shard rebuild that shard's documents, in order
        got = []
        for shard in shard_set.select(domain, split):
            got += rows_to_docs(DomainRows([shard], ROW, PAD_ID), shard_set.tokenizer)
        assert got == docs
        assert len(rows) >= 1
    assert any(len(t.encode()) > ROW for t in corpus_texts())  # a document longer than a row
    assert "" in want[("web", "train")] + want[("web", "heldout")]


def test_every_row_starts_with_bos_and_splits_are_disjoint(prepared, sources):
    shard_set = ShardSet(prepared)
    loader = ShardBatches(shard_set, {"web": 3.0, "code": 1.0}, ROW, 4, seed=1)
    for u in range(30):
        batch = loader.batch(u)
        assert batch.shape == (4, ROW) and bool((batch[:, 0] == BOS_ID).all())
    for domain in ("web", "code"):
        held = loader.heldout(domain, 100)
        assert bool((held[:, 0] == BOS_ID).all())
        train_ids = {d for d in range(200) if split_of(f"web.jsonl:{d}") == "train"}
        held_ids = {d for d in range(200) if split_of(f"web.jsonl:{d}") == "heldout"}
        assert not train_ids & held_ids
    # disjoint by content too: no held-out document is a training document (unique texts)
    train = set(decode_docs(shard_set, "code", "train"))
    held = set(decode_docs(shard_set, "code", "heldout"))
    assert train and held and not train & held


def test_domain_counts_follow_weights_and_cover_every_row(prepared):
    weights = np.array([3.0, 1.0])
    counts = np.stack([domain_counts(weights, 8, u) for u in range(100)])
    assert (counts >= 0).all() and (counts.sum(1) == 8).all()
    assert counts[:, 0].sum() == 600 and counts[:, 1].sum() == 200
    # a domain read past its end starts a new epoch: every row once per epoch
    loader = ShardBatches(ShardSet(prepared), {"code": 1.0}, ROW, 1, seed=3)
    n = len(loader.train["code"])
    seen = [tuple(loader.batch(u)[0].tolist()) for u in range(n)]
    every = {tuple(r) for r in loader.train["code"].rows(np.arange(n)).tolist()}
    assert set(seen) == every


def test_two_gloo_ranks_read_disjoint_rows_that_union_to_one_process(prepared, tmp_path):
    n_batches = 6
    torchrun_run(
        [
            str(REPO / "tests" / "helpers" / "shard_rank_worker.py"),
            str(prepared),
            str(tmp_path),
            str(n_batches),
        ]
    )
    r0, r1 = np.load(tmp_path / "rank0.npy"), np.load(tmp_path / "rank1.npy")
    single = ShardBatches(ShardSet(prepared), {"web": 2.0, "code": 1.0}, ROW, 6, seed=5)
    for u in range(n_batches):
        one = sorted(map(tuple, single.batch(u).tolist()))
        both = sorted(map(tuple, np.concatenate([r0[u], r1[u]]).tolist()))
        assert both == one
        # disjoint: the rows each rank read are different row slots (indices[rank::world])
        assert len(r0[u]) == len(r1[u]) == 3


def tiny_cfg(folder: Path, **over):
    from smelt_interp.train.config import TrainConfig

    shard_set = ShardSet(folder)
    data = {
        "model": {
            "d_model": 32,
            "n_layers": 2,
            "n_heads": 2,
            "n_kv_heads": 1,
            "d_head": 16,
            "n_experts": 2,
            "top_k": 1,
            "d_expert": 32,
            "vocab_size": shard_set.tokenizer.vocab_size,
        },
        "shards": str(folder),
        "data": {"web": 1.0, "code": 1.0},
        "seq_len": ROW,
        "batch_size": 4,
        "grad_accum": 2,
        "steps": 8,
        "warmup_steps": 1,
        "eval_every": 1000,
        "ckpt_every": 3,
        "eval_rows": 2,
        "dyck_eval_n": 0,
        **over,
    }
    return TrainConfig.from_dict(data)


def test_resume_on_shards_sees_the_batches_of_an_uninterrupted_run(prepared, tmp_path, monkeypatch):
    from smelt_interp.train.data import TrainingData
    from smelt_interp.train.trainer import Trainer

    cfg = tiny_cfg(prepared)
    seen: dict[str, list[tuple[int, int, torch.Tensor]]] = {"full": [], "crash": []}
    original_batch = TrainingData.batch_at
    log = seen["full"]

    def recording(self, step, micro=0):
        rows = original_batch(self, step, micro)
        log.append((step, micro, rows))
        return rows

    monkeypatch.setattr(TrainingData, "batch_at", recording)
    full = Trainer(cfg, tmp_path / "full", progress=False)
    full.run()
    full.batches.close()
    log = seen["crash"]
    original_step = Trainer.train_step

    def dying(self, lr):
        if self.step == 5:
            raise KeyboardInterrupt("simulated kill")
        return original_step(self, lr)

    monkeypatch.setattr(Trainer, "train_step", dying)
    with pytest.raises(KeyboardInterrupt):
        Trainer(cfg, tmp_path / "crash", progress=False).run()
    monkeypatch.setattr(Trainer, "train_step", original_step)
    resumed = Trainer(cfg, tmp_path / "crash", resume=True, progress=False)
    resumed.run()
    resumed.batches.close()
    full_by_key = {(s, m): r for s, m, r in seen["full"]}
    after = {(s, m): r for s, m, r in seen["crash"] if s >= 3}  # the resumed steps
    assert {s for s, _ in after} >= set(range(3, 8))
    for key, rows in after.items():
        assert torch.equal(rows, full_by_key[key]), key
    a = full.model.state_dict()
    b = resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_carries_its_tokenizer(prepared, tmp_path):
    from smelt_interp.checkpoint import load_checkpoint
    from smelt_interp.data.bpe import checkpoint_tokenizer
    from smelt_interp.train.trainer import Trainer

    Trainer(tiny_cfg(prepared, steps=2), tmp_path / "r", progress=False).run()
    _, info = load_checkpoint(tmp_path / "r" / "ckpt.pt")
    tok = checkpoint_tokenizer(info.meta)
    assert type(tok) is type(ShardSet(prepared).tokenizer)
    text = "héllo wörld"
    assert tok.decode(tok.encode(text)) == text
    forged = dict(info.meta, tokenizer={**info.meta["tokenizer"], "hash": "0" * 32})
    with pytest.raises(TokenizerError, match="does not match its hash"):
        checkpoint_tokenizer(forged)


def run_cmd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "smelt_interp.data", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )


def one_line_error(proc: subprocess.CompletedProcess, match: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and match in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_input_is_one_line(sources, tmp_path):
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"body": ["x"]}), bad)
    one_line_error(run_cmd("prepare", str(bad), "--out", str(tmp_path / "o1")), "no 'text' column")
    one_line_error(
        run_cmd("prepare", str(sources["root"]), "--out", str(sources["root"] / "out")),
        "inside the source",
    )
    out = tmp_path / "good"
    proc = run_cmd("prepare", f"web={sources['web']}", "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    shard = sorted(out.glob("*.tok"))[0]
    Shard(shard)  # whole: reads
    data = shard.read_bytes()
    cases = {
        "truncated": data[:-5],
        "version": data[:8] + (99).to_bytes(4, "little") + data[12:],
        "tokenizer": data[:40] + b"f" * 32 + data[72:],
        "foreign": b"GARBAGE!" + data[8:],
    }
    messages = {
        "truncated": "truncated",
        "version": "format version 99",
        "tokenizer": "not this one",
        "foreign": "not a token shard",
    }
    for name, damaged in cases.items():
        shard.write_bytes(damaged)
        with pytest.raises(ShardError, match=messages[name]) as err:
            ShardSet(out)
        assert "\n" not in str(err.value)
    shard.write_bytes(data)
    ShardSet(out)
    assert HEADER_BYTES == 1024


def test_shards_of_another_tokenizer_are_refused(prepared):
    shard_set = ShardSet(prepared)
    with pytest.raises(ShardError, match="model's tokenizer"):
        ShardSet(prepared, expect_hash="0" * 32)
    assert shard_set.tokenizer_hash != "0" * 32


def test_prepare_resumes_by_shard(sources, tmp_path, monkeypatch):
    from smelt_interp.data import prepare as prep

    specs = [f"web={sources['web']}"]
    whole = tmp_path / "whole"
    prepare(specs, whole, "bytes", shard_tokens=300)
    original = prep.ShardWriter.close
    calls = {"n": 0}

    def dying_close(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated kill")
        return original(self)

    monkeypatch.setattr(prep.ShardWriter, "close", dying_close)
    part = tmp_path / "part"
    with pytest.raises(KeyboardInterrupt):
        prepare(specs, part, "bytes", shard_tokens=300)
    monkeypatch.setattr(prep.ShardWriter, "close", original)
    done = json.loads((part / MANIFEST).read_text())
    assert len(done["shards"]) == 2 and not done["complete"]
    stats = prepare(specs, part, "bytes", shard_tokens=300)
    assert stats.skipped_docs > 0
    names = sorted(p.name for p in whole.glob("*.tok"))
    assert names == sorted(p.name for p in part.glob("*.tok"))
    for name in names:
        assert (whole / name).read_bytes() == (part / name).read_bytes()


def test_bpe_tokenizer_layout_and_labels():
    tok = train_bpe(iter(corpus_texts() * 3), 300)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (256, 257, 258)
    ids = tok.encode("ab", bos=False)
    assert tok.decode(ids) == "ab"
    assert tok.encode("A", bos=False) == [ord("A")]  # single bytes keep their byte id
    labels = tok.token_labels(tok.encode("héllo 日本"))
    assert labels[0] == "<bos>" and "".join(labels[1:]).replace("␣", " ") != ""
    assert any("\\x" in label or "é" in label for label in labels)
    assert isinstance(tok, BpeTokenizer)


def test_foreign_tokenizer_json_is_refused(tmp_path):
    from tokenizers import Tokenizer, models

    path = tmp_path / "tokenizer.json"
    path.write_text(Tokenizer(models.BPE()).to_str())
    with pytest.raises(TokenizerError, match="lacks the special"):
        read_tokenizer(path)
    path.write_text("{not json")
    with pytest.raises(TokenizerError, match="not valid JSON"):
        read_tokenizer(path)


def test_prepare_refuses_unfinished_or_foreign_folders(sources, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.txt").write_text("hello")
    with pytest.raises(DataError, match="not empty"):
        prepare([str(sources["web"])], other, "bytes")
    out = tmp_path / "o"
    prepare([str(sources["web"])], out, "bytes")
    assert (out / TOKENIZER_FILE).exists()
    with pytest.raises(DataError, match="other sources"):
        prepare([str(sources["code"])], out, "bytes")
    plan = row_plan(ShardSet(out).select("text", "train")[0], ROW)
    assert plan[0].tolist() == [0, 0]


def test_a_bpe_checkpoint_shows_its_tokens_decoded_on_the_dashboard(prepared, tmp_path):
    from smelt_interp.app.prompt_run import run_prompt
    from smelt_interp.app.registry import ModelRegistry
    from smelt_interp.train.trainer import Trainer

    Trainer(tiny_cfg(prepared, steps=1), tmp_path / "r", progress=False).run()
    registry = ModelRegistry({"m": tmp_path / "r" / "ckpt.pt"})
    tok = ShardSet(prepared).tokenizer
    prompt = "line 3: ünïcödé ✓ xxx\nlong document long document"
    run = run_prompt(registry, "m", prompt)
    assert run.ids == tok.encode(prompt)
    assert run.labels[0] == "<bos>" and "⏎" in "".join(run.labels)
    if isinstance(tok, BpeTokenizer):
        # BPE: fewer tokens than bytes, and labels of whole pieces, not one byte each
        assert len(run.ids) < len(prompt.encode()) + 1
        assert any(len(label) > 1 and not label.startswith("\\x") for label in run.labels[1:])
        assert "".join(run.labels[1:]).replace("␣", " ").replace("⏎", "\n") == prompt
    else:
        assert len(run.ids) == len(prompt.encode()) + 1


def slow_row_plan(offsets: list[int], row_len: int) -> list[tuple[int, int]]:
    """The plan row by row: a row at a document's BOS takes row_len tokens, any other row BOS
    and row_len - 1 tokens of the document it starts in."""
    starts, rows, p = set(offsets[:-1]), [], 0
    while p < offsets[-1]:
        rows.append((p, 0) if p in starts else (p, 1))
        p += row_len if p in starts else row_len - 1
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_row_plan_is_the_row_by_row_one(seed):
    """Documents shorter than a row, exactly a row, a row plus one, and long ones, in random
    order, against the row-by-row walk."""
    from types import SimpleNamespace

    rng = np.random.default_rng(seed)
    for row_len in (2, 3, 8, 32):
        lengths = rng.choice([1, 2, row_len - 1, row_len, row_len + 1, 3 * row_len, 97], 60)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        shard = SimpleNamespace(offsets=offsets, header=SimpleNamespace(n_tokens=offsets[-1]))
        got = [tuple(r) for r in row_plan(shard, row_len).tolist()]
        assert got == slow_row_plan(offsets.tolist(), row_len)


@pytest.mark.parametrize("n_rows", [1, 3, 6, 1000])
def test_heldout_mix_shares_rows_evenly_over_the_heldout_domains(prepared, n_rows):
    """Each held-out domain's first rows, in sorted domain order, an even share each (the first
    domain the remainder), a short domain's shortfall taken by the others; checked against the
    rows read domain by domain."""
    shard_set = ShardSet(prepared)
    per_domain = {
        d: DomainRows(shard_set.select(d, "heldout"), ROW, PAD_ID).rows(
            np.arange(len(DomainRows(shard_set.select(d, "heldout"), ROW, PAD_ID)))
        )
        for d in shard_set.domains("heldout")
    }
    assert sorted(per_domain) == ["code", "web"]
    have = {d: len(r) for d, r in per_domain.items()}
    # the expected shares, by hand: half each (code first), capped, the rest to the other
    code = min(have["code"], -(-n_rows // 2))
    web = min(have["web"], n_rows - code)
    code = min(have["code"], n_rows - web)
    want = np.concatenate([per_domain["code"][:code], per_domain["web"][:web]])
    got = heldout_mix(shard_set, ROW, n_rows)
    assert got.dtype == torch.int64
    assert torch.equal(got, torch.from_numpy(want))
    assert len(got) == min(n_rows, sum(have.values()))


def test_probe_rows_from_a_prepared_folder_are_its_heldout_rows(prepared):
    """`--data DIR` of a prepared folder gives the probes heldout_mix's rows with their lengths;
    a model of another tokenizer is refused in one line."""
    from smelt_interp.data.bpe import read_tokenizer
    from smelt_interp.data.tokenizer import ByteTokenizer
    from smelt_interp.probes.inputs import data_batch

    shard_set = ShardSet(prepared)
    tokenizer = read_tokenizer(prepared / TOKENIZER_FILE)
    tokens, lengths = data_batch(str(prepared), 5, ROW, tokenizer=tokenizer)
    assert torch.equal(tokens, heldout_mix(shard_set, ROW, 5))
    for row, n in zip(tokens, lengths):
        assert row[0] == BOS_ID
        assert (row[:n] != PAD_ID).all() and (row[n:] == PAD_ID).all()
    other = ByteTokenizer() if isinstance(tokenizer, BpeTokenizer) else train_bpe(["ab"], 300)
    with pytest.raises(ShardError, match="tokenizer") as info:
        data_batch(str(prepared), 5, ROW, tokenizer=other)
    assert "\n" not in str(info.value)
