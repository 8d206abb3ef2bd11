"""Corpora: domain tags, generated content checked by independent arithmetic, held-out split by
whole documents, packing shapes, and one-line DataErrors for every kind of bad input."""

import json
import re

import pytest
import torch

from smelt_interp.data import dyck
from smelt_interp.data.corpora import Corpus
from smelt_interp.data.documents import Document
from smelt_interp.data.packing import encode_documents
from smelt_interp.data.sources import load_source
from smelt_interp.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, ByteTokenizer
from smelt_interp.errors import DataError

TOK = ByteTokenizer()
ARITH = re.compile(r"^(\d+)([+\-*])(\d+)=(-?\d+)$")


def one_line_error(spec, *needles):
    with pytest.raises(DataError) as info:
        load_source(str(spec))
    msg = str(info.value)
    assert "\n" not in msg
    for needle in needles:
        assert str(needle) in msg, msg
    return msg


def test_arith_lines_are_correct_and_tagged():
    docs = load_source("arith", n_docs=40, seed=3)
    assert len(docs) == 40 and {d.domain for d in docs} == {"arith"}
    ops = set()
    for doc in docs:
        for line in doc.text.splitlines():
            a, op, b, c = ARITH.match(line).groups()
            a, b, c = int(a), int(b), int(c)
            assert c == {"+": a + b, "-": a - b, "*": a * b}[op]
            ops.add(op)
    assert ops == {"+", "-", "*"}
    assert load_source("arith", n_docs=40, seed=3) == docs  # deterministic


def test_dyck_documents_correct_and_split_consistent():
    docs = load_source("dyck", n_docs=60)
    assert {d.domain for d in docs} == {"dyck"}
    for doc in docs:
        for line in doc.text.splitlines():
            prefix, answer = re.match(r"^Input: (.+) Output: (.+)$", line).groups()
            assert answer == dyck.closing_sequence(prefix)
            assert dyck.query_split(prefix) == doc.split  # whole document in one split


def test_code_is_real_stdlib_python_within_budget():
    docs = load_source("code", max_bytes=150_000)
    assert docs and {d.domain for d in docs} == {"code"}
    assert docs == load_source("code", max_bytes=150_000)
    total = sum(d.n_bytes for d in docs)
    assert total - docs[-1].n_bytes < 150_000
    for doc in docs[:5]:
        assert doc.id.startswith("stdlib/") and doc.id.endswith(".py")
        compile(doc.text, doc.id, "exec")


def test_user_folder_and_jsonl(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("alpha text")
    (tmp_path / "sub" / "b.md").write_text("# beta ü")
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "skip.bin").write_bytes(b"\xff\xfe")
    (tmp_path / "c.jsonl").write_text(
        json.dumps({"text": "one"}) + "\n\n" + json.dumps({"text": "two", "domain": "prose"}) + "\n"
    )
    docs = load_source(str(tmp_path))
    got = {(d.id, d.domain, d.text) for d in docs}
    assert got == {
        ("a.txt", "text", "alpha text"),
        ("sub/b.md", "text", "# beta ü"),
        ("c.jsonl:1", "text", "one"),
        ("c.jsonl:3", "prose", "two"),
    }
    named = load_source(f"notes={tmp_path / 'a.txt'}")
    assert [(d.id, d.domain) for d in named] == [("a.txt", "notes")]


def test_bad_inputs_raise_one_line_data_errors(tmp_path):
    one_line_error(tmp_path / "nope", "nope", "no such file")
    (tmp_path / "empty").mkdir()
    one_line_error(tmp_path / "empty", "empty corpus")
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "x.txt").write_text(" \n\t")
    one_line_error(tmp_path / "blank", "empty corpus")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café".encode("latin-1"))
    one_line_error(latin, "latin.txt", "not UTF-8")
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "ok"}\n{"text": \n')
    one_line_error(bad_json, "bad.jsonl:2", "not valid JSON")
    no_text = tmp_path / "notext.jsonl"
    no_text.write_text('{"body": "x"}\n')
    one_line_error(no_text, "notext.jsonl:1", "text")
    surrogate = tmp_path / "sur.jsonl"
    surrogate.write_text('{"text": "a \\ud800 b"}\n')
    one_line_error(surrogate, "sur.jsonl:1", "surrogate")
    nested = tmp_path / "nested"
    (nested / "deep").mkdir(parents=True)
    (nested / "deep" / "bad.md").write_bytes(b"ok \xc3\x28")
    one_line_error(nested, "bad.md", "not UTF-8")
    with pytest.raises(DataError):
        Corpus([])


def marked_corpus(n=300):
    docs = [Document(f"doc{i:04d}.txt", "text", f"<{i:04d}>" + "x" * (i % 37)) for i in range(n)]
    docs += [Document(f"a{i}", "arith", f"{i}+1={i + 1}\n") for i in range(50)]
    return Corpus(docs)


def markers(rows):
    """Document markers in packed rows; rows continue one stream, so join them without BOS."""
    text = TOK.decode(rows[:, 1:].reshape(-1))
    return {int(m) for m in re.findall(r"<(\d{4})>", text)}


def test_heldout_split_is_by_whole_document():
    corpus = marked_corpus()
    train = {int(d.text[1:5]) for d in corpus.select("text", "train")}
    held = {int(d.text[1:5]) for d in corpus.select("text", "heldout")}
    assert train | held == set(range(300)) and not (train & held)
    assert 10 <= len(held) <= 60
    assert [d.split for d in corpus.documents] == [d.split for d in marked_corpus().documents]
    held_rows = corpus.heldout_batches("text", 100, 64)
    assert markers(held_rows) == held  # every held-out document, and nothing else
    mix = corpus.mixture({"text": 1.0}, seed=1)
    seen = markers(torch.cat([mix.batch(8, 64) for _ in range(20)]))
    assert seen and seen <= train


def test_heldout_batches_shape_and_padding():
    corpus = marked_corpus()
    rows = corpus.heldout_batches("text", 1000, 32)
    assert rows.dtype == torch.long and rows.shape[1] == 32 and rows.shape[0] < 1000
    assert (rows[:, 0] == BOS_ID).all() and not (rows[:-1] == PAD_ID).any()
    assert torch.equal(rows, corpus.heldout_batches("text", 1000, 32))
    assert corpus.heldout_batches("text", 2, 32).shape == (2, 32)
    with pytest.raises(DataError, match="unknown domain"):
        corpus.heldout_batches("nope", 2, 32)


def test_mixture_rows_weights_and_domains():
    corpus = Corpus(load_source("arith", n_docs=50) + load_source("dyck", n_docs=50))
    assert corpus.domains == ["arith", "dyck"]
    mix = corpus.mixture({"arith": 3.0, "dyck": 1.0}, seed=0)
    batch, domains = mix.batch_with_domains(200, 48)
    assert batch.shape == (200, 48) and batch.dtype == torch.long
    assert (batch[:, 0] == BOS_ID).all() and not (batch == PAD_ID).any()
    assert 0.6 < domains.count("arith") / 200 < 0.9
    for row, dom in zip(batch, domains):
        text = TOK.decode(row)  # arithmetic has no spaces; any window of Dyck text has some
        assert (set(text) <= set("0123456789+-*=\n")) == (dom == "arith")
    assert (batch == EOS_ID).any()  # documents are separated by EOS
    only = corpus.mixture({"arith": 1.0, "dyck": 0.0})
    assert set(only.batch_with_domains(20, 16)[1]) == {"arith"}
    assert next(only.batches(3, 16)).shape == (3, 16)
    for bad in ({"nope": 1.0}, {"arith": -1.0}, {"arith": 0.0, "dyck": 0.0}):
        with pytest.raises(DataError):
            corpus.mixture(bad)


def test_table_and_encode_documents_for_length_buckets():
    corpus = marked_corpus(20)
    table = corpus.table()
    assert {r["domain"] for r in table} == {"text", "arith"}
    assert all(r["n_bytes"] == len(d.text.encode()) for r, d in zip(table, corpus.documents))
    ids, lengths = encode_documents(corpus.documents[:3], 16)
    assert ids.shape == (3, 16) and (ids[:, 0] == BOS_ID).all()
    assert lengths.tolist() == [min(16, d.n_bytes + 2) for d in corpus.documents[:3]]
    assert ids[0, lengths[0] - 1] == EOS_ID and (ids[0, lengths[0] :] == PAD_ID).all()
