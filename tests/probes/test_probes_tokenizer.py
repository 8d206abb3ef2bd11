"""Every probe reader uses the checkpoint's own tokenizer: `--prompt` and `--data` text are
encoded with it (BPE ids for a BPE checkpoint, bytes otherwise), labels are decoded with it,
and a tokenizer that does not match its hash, a prompt it cannot encode, recall rows on a BPE
model and a pair of different tokenizers are each one `error:` line. (In-context Dyck prompts
are posed to a BPE model in its own tokens: tests/probes/test_dyck_bpe.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.bad_input import assert_one_line_error, run_command
from helpers.bpe_models import sample_texts, tiny_bpe, tiny_checkpoint

from smelt_interp import report
from smelt_interp.checkpoint import read_payload
from smelt_interp.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, ByteTokenizer
from smelt_interp.errors import ProbeError
from smelt_interp.probes.inputs import ProbeInputs, data_batch

PROMPT = "def function_7(value):\n    return value * 7 + the_offset"


@pytest.fixture(scope="module")
def bpe():
    return tiny_bpe()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, bpe) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tok")
    return {
        "bpe": tiny_checkpoint(root / "bpe" / "ckpt.pt", bpe),
        "bpe_base": tiny_checkpoint(root / "bpe_base" / "ckpt.pt", bpe, looped=False, seed=1),
        "bytes": tiny_checkpoint(root / "bytes" / "ckpt.pt", ByteTokenizer()),
    }


def probe(*args) -> tuple[int, str, str]:
    return run_command("smelt_interp.probes.sink", *args)


def test_prompt_on_a_bpe_checkpoint_is_labelled_with_its_bpe_tokens(ckpts, bpe, tmp_path):
    out = tmp_path / "sink.json"
    code, stdout, err = probe(ckpts["bpe"], "--prompt", PROMPT, "--json", out, "--device", "cpu")
    assert code == 0, err
    tokens = json.loads(out.read_text())["tokens"]
    # independent reference: the HF tokenizer's own encoding, BOS in front
    want = [BOS_ID, *bpe._tok.encode(PROMPT, add_special_tokens=False).ids]
    assert tokens["ids"] == want
    assert len(want) < len(PROMPT.encode()) + 1  # merged pieces, not one id per byte
    labels = tokens["labels"]
    assert labels[0] == "<bos>"
    assert any(len(label) > 1 for label in labels[1:])  # whole pieces such as 'value'
    assert "".join(labels[1:]).replace("␣", " ") == PROMPT
    assert "tokens: <bos> " + " ".join(labels[1:]) in stdout


def test_prompt_on_a_byte_checkpoint_is_labelled_byte_by_byte(ckpts, tmp_path):
    out = tmp_path / "sink.json"
    code, _, err = probe(ckpts["bytes"], "--prompt", "ab c", "--json", out, "--device", "cpu")
    assert code == 0, err
    tokens = json.loads(out.read_text())["tokens"]
    assert tokens["ids"] == [BOS_ID, 97, 98, 32, 99]
    assert tokens["labels"] == ["<bos>", "a", "b", "␣", "c"]


def test_data_rows_of_a_bpe_model_are_its_ids(tmp_path, bpe):
    """--data PATH packs the documents in the model's ids: BOS, then each document's ids and
    EOS, one after another (reference: the tokenizer's own encoding, packed by hand)."""
    docs = tmp_path / "docs.jsonl"
    texts = sample_texts()[:6]
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tokens, lengths = data_batch(str(docs), n_seqs=3, seq_len=24, tokenizer=bpe)
    stream = [i for t in texts for i in (*bpe._tok.encode(t).ids, EOS_ID)]
    for r in range(tokens.shape[0]):
        want = stream[r * 23 : (r + 1) * 23]
        assert tokens[r, 0] == BOS_ID
        assert tokens[r, 1 : 1 + len(want)].tolist() == want
    assert (tokens[:, 1:] != PAD_ID).sum() == min(len(stream), 3 * 23)
    byte_rows, _ = data_batch(str(docs), n_seqs=3, seq_len=24)
    assert byte_rows[0, 1:4].tolist() == list(texts[0].encode()[:3])  # the default stays bytes


def test_a_forged_tokenizer_hash_is_one_line(ckpts, tmp_path):
    payload = read_payload(ckpts["bpe"])
    payload["meta"]["tokenizer"]["hash"] = "0" * 32
    forged = tmp_path / "forged.pt"
    torch.save(payload, forged)
    code, _, err = probe(forged, "--prompt", PROMPT, "--device", "cpu")
    assert_one_line_error(code, err, "does not match its hash")


def test_a_prompt_the_tokenizer_cannot_encode_is_one_line(ckpts):
    code, _, err = probe(ckpts["bpe"], "--prompt", "ok \ud800 bad", "--device", "cpu")
    assert_one_line_error(code, err, "not valid unicode", "position 3")
    code, _, err = probe(ckpts["bpe"], "--prompt", "x" * 200, "--device", "cpu")
    assert_one_line_error(code, err, "tokens long", "allows 64")


def test_recall_rows_are_refused_on_a_bpe_model(ckpts):
    code, _, err = run_command(
        "smelt_interp.probes.case_study", ckpts["bpe"], "--task", "assoc_recall", "--device", "cpu"
    )
    assert_one_line_error(code, err, "spelled in bytes", "BPE")
    inputs = ProbeInputs(seq_len=32, max_seq_len=64, tokenizer=tiny_bpe())
    with pytest.raises(ProbeError, match="associative-recall rows are spelled in bytes"):
        inputs.recall_rows()


def test_a_pair_of_different_tokenizers_is_one_line(ckpts):
    code, _, err = probe(ckpts["bpe"], "--compare", ckpts["bytes"], "--prompt", "a")
    assert_one_line_error(code, err, "different tokenizers")


def test_report_on_a_bpe_pair_decodes_with_its_tokenizer(ckpts, bpe, tmp_path):
    js, page = tmp_path / "r.json", tmp_path / "r.html"
    argv = [str(ckpts["bpe"]), "--compare", str(ckpts["bpe_base"]), "--prompt", PROMPT]
    argv += ["--demos", "0,1", "--draw", "validation"]  # the prompts that fit 64 tokens
    assert report.main([*argv, "--json", str(js), "--html", str(page), "--device", "cpu"]) == 0
    data = json.loads(js.read_text())
    labels = data["inputs"]["tokens"]["labels"]
    assert labels == bpe.token_labels(bpe.encode(PROMPT))
    assert "value" in labels and "<code>value</code>" in page.read_text()
    assert not data["probes"]["case_study"].get("skipped")  # Dyck prompts in its BPE tokens
    lens = data["probes"]["lens"]["tables"]["depths"]
    assert lens[0]["ce"] is not None and lens[0]["dyck_exact"] is not None


def test_completion_and_labels_go_through_the_checkpoints_tokenizer(ckpts, bpe):
    from smelt_interp.checkpoint import load_checkpoint
    from smelt_interp.probes.text import complete_text, text_labels, tokenizer_of

    tok = tokenizer_of(ckpts["bpe"])
    assert tok.hash == bpe.hash
    model, _ = load_checkpoint(ckpts["bpe"])
    got = complete_text(model, tok, "def function_", max_new_tokens=6)
    ids = [BOS_ID, *bpe._tok.encode("def function_").ids]  # a greedy loop, no KV cache
    new = []
    for _ in range(6):
        with torch.no_grad():
            nxt = int(model(torch.tensor([ids + new]))[0, -1].argmax())
        if nxt == EOS_ID:
            break
        new.append(nxt)
    assert got == bpe._tok.decode(new)
    _, labels = text_labels(tok, "the quick")
    assert labels[0] == "<bos>" and "".join(labels[1:]).replace("␣", " ") == "the quick"
    assert tokenizer_of(ckpts["bytes"]).token_labels([97]) == ["a"]


def test_tokenizers_are_equal_by_what_they_encode(bpe):
    """Inputs built twice for the same checkpoint are equal (a cache key holds them)."""
    assert ByteTokenizer() == ByteTokenizer() and hash(ByteTokenizer()) == hash(ByteTokenizer())
    again = tiny_bpe()
    assert again == bpe and hash(again) == hash(bpe) and again is not bpe
    assert bpe != ByteTokenizer()
    one = ProbeInputs(seq_len=32, tokenizer=bpe)
    assert one == ProbeInputs(seq_len=32, tokenizer=again)
    assert one != ProbeInputs(seq_len=32)
