"""The Dyck case study on a BPE model: the in-context prompts are encoded with the model's
tokenizer and their positions carried to its tokens. Against an independent slow scan (token
texts decoded one id at a time and laid end to end, answers found after each "Output: " to
the end of its line): the token spans of the answers and demonstration answers, and the
probe's BOS and demonstration masses at the answer positions recomputed in float64 from each
visit's `hook_pattern`; tokens that merge several brackets; a tokenizer whose tokens cross an
answer's boundary refused in one line; a merge-free BPE giving the byte prompts exactly; and
exact match in token space, greedy and teacher-forced."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers.bad_input import assert_one_line_error, run_command
from helpers.bpe_models import sample_texts, tiny_checkpoint

from smelt_interp.data.bpe import BpeTokenizer, train_bpe
from smelt_interp.data.dyck import DyckSpec, make_dataset
from smelt_interp.data.dyck_tokens import AmbiguousPrompt, encode_example, encode_examples
from smelt_interp.errors import DataError, ProbeError
from smelt_interp.measure import dyck_score, group_masses
from smelt_interp.model.protocol import hook_name
from smelt_interp.probes import case_study
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import ProbeOptions

OPTS = ProbeOptions(batch_size=2, chunk=5)
VOCAB = 400


def dyck_texts() -> list[str]:
    """About 8 KB of training-split Dyck prompts (never the held-out words the probe draws)."""
    examples = make_dataset(80, spec=DyckSpec(max_len=12), n_demos=1, seed=11, split="train")
    return [ex.text + "\n" for ex in examples]


def hf_bpe(split: str) -> BpeTokenizer:
    """A byte-level BPE learned from dyck_texts whose pre-tokenizer cuts only at `split` (a
    regex), so merges run across spaces: ' ) ]' can be one token."""
    from tokenizers import Regex, pre_tokenizers

    cut_only_at_split = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return train_bpe(dyck_texts(), VOCAB, pre_tokenizer=cut_only_at_split)


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, BpeTokenizer]:
    return {
        # GPT-2's pre-tokenizer pattern (what --tokenizer bpe:N trains): ' (' and 'Output' merge
        "words": train_bpe(iter(sample_texts() + dyck_texts()), VOCAB),
        # cut only around 'Input:', 'Output:' and newlines: runs of brackets merge
        "runs": hf_bpe(r"Input:|Output:|\n"),
        # cut only at newlines: ': )' can be one token, crossing the answer's boundary
        "crossing": hf_bpe(r"\n"),
    }


def slow_scan(tokenizer: BpeTokenizer, text: str) -> tuple[list[int], list[list[int]]] | None:
    """(token indices of the query's answer, token indices of each demonstration's answer),
    BOS counted as index 0, by walking the characters: each token's text decoded alone, an
    answer the characters after an 'Output: ' up to its line's end, a token in the answer its
    first non-space character is in (a space-only token: its first character's). None when a
    token's non-space characters lie in and out of an answer."""
    ids = tokenizer.encode(text)
    pieces = [tokenizer.decode([i]) for i in ids[1:]]
    assert "".join(pieces) == text
    answers = []
    at = text.find("Output: ")
    while at >= 0:
        start = at + len("Output: ")
        end = text.find("\n", start)
        answers.append((start, len(text) if end < 0 else end))
        at = text.find("Output: ", start)
    owners: list[list[int]] = [[] for _ in answers]
    pos = 0
    for index, piece in enumerate(pieces, start=1):
        found = set()
        for c in range(pos, pos + len(piece)):
            if text[c] != " " and text[c] != "\n" or c == pos and not piece.strip():
                found.add(next((k for k, (s, e) in enumerate(answers) if s <= c < e), -1))
        pos += len(piece)
        if len(found) > 1:
            return None
        if found and found != {-1}:
            owners[found.pop()].append(index)
    return owners[-1], owners[:-1]


def brackets(tokenizer: BpeTokenizer, ids) -> list[int]:
    return [sum(ch in "()[]{}<>" for ch in tokenizer.decode([i])) for i in ids]


@pytest.mark.parametrize("name", ["words", "runs"])
def test_token_spans_are_the_slow_scans(tokenizers, name):
    tok = tokenizers[name]
    examples = ProbeInputs(n_seqs=6, max_seq_len=128, demos=(0, 1, 3), tokenizer=tok, seed=2)
    merged = 0
    for ex in examples.dyck_examples():
        answer, demos = slow_scan(tok, ex.text)
        assert list(ex.ids) == tok.encode(ex.text)
        assert list(range(*ex.answer_span)) == answer and ex.answer_span[1] == len(ex.ids)
        assert [list(range(*span)) for span in ex.demo_answer_spans] == demos
        assert tok.decode(ex.ids[ex.answer_span[0] :]).strip() == ex.answer
        spans = [ex.answer_span, *ex.demo_answer_spans]
        merged += sum(n > 1 for s, e in spans for n in brackets(tok, ex.ids[s:e]))
        assert len(ex.ids) < len(ex.text) + 1  # BPE tokens, not bytes
    if name == "runs":
        assert merged > 10  # tokens holding several brackets, one position each


@pytest.mark.parametrize("name", ["words", "runs"])
def test_bpe_case_study_masses_equal_a_float64_brute_force(tokenizers, name, make_cfg, make_model):
    """The probe's BOS and demonstration masses at the answer positions, per demonstration
    count and (layer, visit, head), from each visit's hook_pattern with the slow scan's
    positions."""
    tok = tokenizers[name]
    cfg = make_cfg(init_std=0.3, max_seq_len=128, vocab_size=tok.vocab_size)
    model = make_model(cfg, seed=3)
    inputs = ProbeInputs(n_seqs=3, max_seq_len=128, demos=(0, 2), seed=4, tokenizer=tok)
    heads = case_study.run(model, inputs, OPTS)["heads"]
    sums: dict = {}
    for n_demos, group in group_masses.by_demos(inputs.dyck_examples()).items():
        rows = [tok.encode(ex.text) for ex in group]  # the slow scan's own tokens
        width = max(map(len, rows))
        tokens = torch.tensor([r + [tok.pad_id] * (width - len(r)) for r in rows])
        names = model.hook_names("attn.hook_pattern")
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
        for r, ex in enumerate(group):
            answer, demos = slow_scan(tok, ex.text)
            keys = sorted(k for d in demos for k in d)
            for lv in model.schedule:
                pat = cache[hook_name(*lv, "attn.hook_pattern")][r].double().numpy()
                acc = sums.setdefault((n_demos, *lv), np.zeros((pat.shape[0], 3)))
                for q in (t - 1 for t in answer):
                    for head in range(pat.shape[0]):
                        acc[head, 0] += pat[head, q, 0]
                        acc[head, 1] += sum(pat[head, q, k] for k in keys)
                        acc[head, 2] += 1
    assert {key[0] for key in sums} == {0, 2}
    for (n_demos, layer, visit), acc in sums.items():
        got = heads.query(f"n_demos == {n_demos} and layer == {layer} and visit == {visit}")
        got = got.sort_values("head")
        assert got["bos_mass"].to_numpy() == pytest.approx(acc[:, 0] / acc[:, 2], abs=1e-6)
        assert got["demo_mass"].to_numpy() == pytest.approx(acc[:, 1] / acc[:, 2], abs=1e-6)
        assert (acc[:, 1] > 0).all() == (n_demos > 0)


def test_a_token_crossing_an_answers_boundary_is_refused_in_one_line(tokenizers):
    tok = tokenizers["crossing"]
    drawn = make_dataset(20, spec=DyckSpec(max_len=10), n_demos=1, seed=5, split="heldout")
    crossing = [slow_scan(tok, ex.text) is None for ex in drawn]
    assert any(crossing)
    for ex, crosses in zip(drawn, crossing):
        if crosses:
            with pytest.raises(AmbiguousPrompt, match="crosses the boundary of an answer"):
                encode_example(ex, tok)
        else:
            answer, _ = slow_scan(tok, ex.text)
            assert list(range(*encode_example(ex, tok).answer_span)) == answer
    with pytest.raises(DataError, match=f"{sum(crossing)} of 20 Dyck prompts cannot be posed"):
        encode_examples(drawn, tok)
    inputs = ProbeInputs(n_seqs=8, max_seq_len=128, demos=(1,), tokenizer=tok)
    with pytest.raises(ProbeError, match="cannot be posed") as info:
        inputs.dyck_examples()
    assert "\n" not in str(info.value)


def test_a_merge_free_bpe_poses_the_byte_prompts_exactly():
    """With no merges, BPE ids are the bytes (and the same specials), so every span must be
    the byte prompt's own."""
    bare = train_bpe(iter(["( ) [ ]"]), 259)
    for ex in make_dataset(10, n_demos=2, seed=1, split="heldout"):
        assert encode_example(ex, bare) == ex


class OracleModel:
    """Writes each prompt's answer in the tokens `spell` gives, then a stop: greedy
    generation, and one-hot logits of the same continuation for teacher forcing."""

    def __init__(self, tokenizer, examples, spell, stop):
        self.cfg = SimpleNamespace(max_seq_len=512)
        self.tok, self.stop = tokenizer, stop
        self.next = {}
        for ex in examples:
            prompt = list(ex.prompt_ids)
            written = prompt + spell(ex) + [stop]
            for t in range(len(prompt), len(written)):
                self.next[tuple(written[:t])] = written[t]

    def __call__(self, tokens):
        out = torch.zeros(*tokens.shape, self.tok.vocab_size)
        for r, row in enumerate(tokens.tolist()):
            for t in range(len(row)):
                out[r, t, self.next.get(tuple(row[: t + 1]), 0)] = 1.0
        return out

    def generate(self, tokens, max_new_tokens, temperature=0.0):
        rows = []
        for row in tokens.tolist():
            for _ in range(max_new_tokens):
                row = row + [self.next.get(tuple(row), self.tok.eos_id)]
            rows.append(row)
        return torch.tensor(rows)


def test_exact_match_works_in_token_space(tokenizers):
    """Greedy and teacher-forced exact match on BPE prompts: the tokenizer's own spelling of
    the answer and a stop token that merges a newline with indentation count as exact both
    ways; the answer spelt byte by byte is a greedy hit and a teacher-forced miss."""
    tok = tokenizers["words"]
    drawn = make_dataset(6, spec=DyckSpec(max_len=10), n_demos=1, seed=8, split="heldout")
    examples = encode_examples(drawn, tok)
    indented = tok.encode("\n    ", bos=False)
    stop = indented[0] if len(indented) == 1 else tok.encode("\n", bos=False)[0]
    assert stop in dyck_score.stop_ids(tok)
    own = OracleModel(tok, examples, lambda ex: list(ex.ids[ex.answer_span[0] :]), stop)
    assert dyck_score.teacher_forced_exact_match(own, examples, tokenizer=tok) == [True] * 6
    assert dyck_score.complete_many(own, examples, tokenizer=tok) == [e.answer for e in examples]
    assert dyck_score.exact_match_accuracy(own, examples, tokenizer=tok) == 1.0
    by_byte = OracleModel(tok, examples, lambda ex: list((" " + ex.answer).encode()), stop)
    assert dyck_score.teacher_forced_exact_match(by_byte, examples, tokenizer=tok) == [False] * 6
    assert dyck_score.exact_match_accuracy(by_byte, examples, tokenizer=tok) == 1.0
    query, demo = drawn[0].query, drawn[0].demos[0]
    assert dyck_score.complete(own, query, demos=[demo], tokenizer=tok) == drawn[0].answer


def test_the_case_study_command_runs_on_a_bpe_checkpoint(tokenizers, tmp_path):
    tok = tokenizers["words"]
    ckpt = tiny_checkpoint(tmp_path / "ckpt.pt", tok, max_seq_len=128)
    code, out, err = run_command(
        "smelt_interp.probes.case_study", ckpt, "--demos", "0,1", "--n-seqs", "2", "--device", "cpu"
    )
    assert code == 0, err
    assert "bos mass at answer positions" in out
    crossing = tiny_checkpoint(tmp_path / "crossing.pt", tokenizers["crossing"], max_seq_len=128)
    code, _, err = run_command(
        "smelt_interp.probes.case_study", crossing, "--demos", "1", "--device", "cpu"
    )
    assert_one_line_error(code, err, "cannot be posed")


def test_the_dashboards_dyck_case_is_in_the_models_tokens(tokenizers, tmp_path):
    """The case-study page's own prompt on a BPE checkpoint: ids, answer span and
    demonstration spans are the slow scan's, and the completion is decoded with its BPE."""
    from smelt_interp.app.pages.case_study.dyck import cached_case
    from smelt_interp.app.registry import ModelRegistry
    from smelt_interp.app.served import Served

    tok = tokenizers["words"]
    registry = ModelRegistry({"m": tiny_checkpoint(tmp_path / "m.pt", tok, max_seq_len=128)})
    case = cached_case(Served(registry), "m", "( [ { } ]\n< ( ) ( <\n( [")
    ex = case.example
    answer, demos = slow_scan(tok, ex.text)
    assert list(ex.ids) == tok.encode(ex.text) and len(ex.ids) < len(ex.text) + 1
    assert list(range(*ex.answer_span)) == answer
    assert [list(range(*span)) for span in ex.demo_answer_spans] == demos
    assert set(case.visits["n_demos"]) == {2} and case.correct == (case.completion == "] )")


def test_the_patching_probe_pairs_a_bpe_model_in_its_tokens(tokenizers, make_cfg, make_model):
    """The registered patching probe on a BPE model: its Dyck pair is the model's own tokens
    (each clean row re-encodes to itself, one token changed in its twin) and every head gets an
    activation and an attribution figure; a recall pair, rows of bytes, is refused in one line."""
    from smelt_interp.probes import patching

    tok = tokenizers["words"]
    model = make_model(make_cfg(looped=True, max_seq_len=128, vocab_size=tok.vocab_size))
    inputs = ProbeInputs(n_seqs=2, max_seq_len=128, demos=(0, 1), seed=1, tokenizer=tok)
    pair = patching.task_pair(model, inputs, 2)
    for row in range(pair.n_rows):
        end = int(pair.position[row]) + 1
        clean = pair.clean[row, :end].tolist()
        assert tok.encode(tok.decode(clean)) == clean
        assert sum(a != b for a, b in zip(clean, pair.corrupt[row, :end].tolist())) == 1
    heads = patching.run(model, inputs, OPTS)["heads"]
    assert len(heads) == len(model.schedule) * model.cfg.n_heads
    assert heads["activation"].notna().all() and heads["attribution"].notna().all()
    recall = ProbeInputs(n_seqs=2, max_seq_len=128, task="assoc_recall", tokenizer=tok)
    with pytest.raises(ProbeError, match="spelled in bytes"):
        patching.task_pair(model, recall, 2)


def test_a_tokenizer_that_cannot_pair_dyck_says_so(tokenizers, monkeypatch):
    """Where no draw's twin reads as one changed token (here: every token crosses an answer's
    boundary), the error counts the draws it could not pair instead of blaming the context."""
    from smelt_interp.data import patch_pairs

    def crossing(example, tokenizer):
        raise AmbiguousPrompt("a token crosses the answer's boundary")

    monkeypatch.setattr(patch_pairs, "encode_example", crossing)
    draws = f"{patch_pairs.MAX_DRAWS:,}"
    with pytest.raises(DataError, match=rf"only 0 of 2 .* in {draws} draws: {draws} changed"):
        patch_pairs.dyck_pair(2, tokenizer=tokenizers["words"])
