"""Dyck data against independent references: a pair-cancelling balance check, brute-force
shortest completions, and exact token spans."""

import itertools
import random
import re
from types import SimpleNamespace

import pytest
import torch

from smelt_interp.data import dyck, packing
from smelt_interp.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, ByteTokenizer
from smelt_interp.errors import ConfigError, DataError
from smelt_interp.measure import dyck_score as dyck_eval
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.data import TrainingData

TOK = ByteTokenizer()
PAIRS = ["()", "[]", "{}", "<>"]
LINE = re.compile(r"^Input: ([\(\)\[\]\{\}<> ]+) Output: ([\)\]\}> ]+)$")


def balanced(text: str) -> bool:
    """Independent check: cancel adjacent matching pairs until nothing changes."""
    s = text.replace(" ", "")
    while True:
        t = s
        for p in PAIRS:
            t = t.replace(p, "")
        if t == s:
            return s == ""
        s = t


def max_depth(text: str) -> int:
    depth = best = 0
    for ch in text.replace(" ", ""):
        depth += 1 if ch in "([{<" else -1
        best = max(best, depth)
    return best


def brute_force_answer(prefix: str) -> str:
    """The unique shortest closing sequence, by exhaustive search over closers."""
    for n in range(1, 9):
        hits = [c for c in itertools.product(")]}>", repeat=n) if balanced(prefix + "".join(c))]
        if hits:
            assert len(hits) == 1
            return " ".join(hits[0])
    raise AssertionError(f"no completion of {prefix!r} within 8 brackets")


def test_words_balanced_and_controls_respected():
    rng = random.Random(0)
    for n_pairs, depth, lo, hi in [(1, 3, 2, 12), (2, 2, 6, 10), (4, 5, 2, 30)]:
        spec = dyck.DyckSpec(n_pairs=n_pairs, max_depth=depth, min_len=lo, max_len=hi)
        allowed = set("".join(PAIRS[:n_pairs]) + " ")
        lengths = set()
        for _ in range(300):
            w = dyck.random_word(rng, spec)
            n = len(w.split())
            assert balanced(w) and set(w) <= allowed
            assert lo <= n <= hi and max_depth(w) <= depth
            lengths.add(n)
        assert len(lengths) > 1  # lengths actually vary


def test_prefix_answers_match_brute_force_and_controls():
    rng = random.Random(1)
    spec = dyck.DyckSpec(n_pairs=4, max_depth=4, min_len=4, max_len=12)
    answer_lengths = set()
    for _ in range(150):
        p = dyck.random_prefix(rng, spec)
        a = dyck.closing_sequence(p)
        assert a and not balanced(p)
        assert a == brute_force_answer(p)
        whole = p + " " + a
        assert balanced(whole) and max_depth(whole) <= 4
        assert 4 <= len(whole.split()) <= 12
        answer_lengths.add(len(a.split()))
    assert answer_lengths == {1, 2, 3, 4}


def test_closing_sequence_reference_cases():
    assert dyck.closing_sequence("( [ {") == "} ] )"
    assert dyck.closing_sequence("( [ { } ") == "] )"
    assert dyck.closing_sequence("<(") == ") >"
    assert dyck.closing_sequence("( )") == ""


def test_dataset_spans_decode_and_point_at_answers():
    examples = dyck.make_dataset(40, spec=dyck.DyckSpec(max_len=16), n_demos=3, seed=2)
    for ex in examples:
        ids = list(ex.ids)
        assert ids[0] == BOS_ID and ids == TOK.encode(ex.text)
        assert ex.n_demos == 3 and len(ex.demo_answer_spans) == 3
        s, e = ex.answer_span
        assert e == len(ids) and TOK.decode(ids[s:e]) == ex.answer
        assert TOK.decode(ids[s - 8 : s]) == "Output: "
        assert ex.answer == brute_force_answer(ex.query)
        assert ex.text == ex.prompt + ex.answer and list(ex.prompt_ids) == ids[:s]
        # the prompt ends with the query; demonstrations come first, one per line
        lines = ex.text.split("\n")
        assert len(lines) == 4 and lines[-1] == f"Input: {ex.query} Output: {ex.answer}"
        for (ds, de), (dp, da), line in zip(ex.demo_answer_spans, ex.demos, lines):
            assert TOK.decode(ids[ds:de]) == da == brute_force_answer(dp)
            assert ids[de] == ord("\n") and ids[ds - 1] == ord(" ")
            assert LINE.match(line).groups() == (dp, da)
        assert [s for s, _ in ex.demo_answer_spans] == sorted(s for s, _ in ex.demo_answer_spans)


def test_train_heldout_disjoint_across_seeds():
    spec = dyck.DyckSpec(n_pairs=2, max_depth=3, min_len=2, max_len=8)  # leaks would show
    train = {ex.query for seed in range(3) for ex in dyck.make_dataset(400, spec=spec, seed=seed)}
    held_ex = dyck.make_dataset(200, spec=spec, seed=7, split="heldout", n_demos=2)
    held = {ex.query for ex in held_ex}
    assert train and held and not (train & held)
    assert all(p not in train for ex in held_ex for p, _ in ex.demos)  # demos from the same split
    assert len(held) / (len(train) + len(held)) < 0.35


def test_packed_rows_shape_bos_and_content():
    rows = dyck.packed_rows(4, 128, seed=3, spec=dyck.DyckSpec(max_len=10))
    assert rows.shape == (4, 128) and rows.dtype == torch.long
    assert (rows[:, 0] == BOS_ID).all()
    assert not (rows[:, 1:] == BOS_ID).any() and not ((rows == PAD_ID) | (rows == EOS_ID)).any()
    for row in rows:
        lines = TOK.decode(row).split("\n")
        assert len(lines) >= 4
        for line in lines[:-1]:  # the last example is cut off at the row's end
            prefix, answer = LINE.match(line).groups()
            assert answer == brute_force_answer(prefix)
            assert dyck.query_split(prefix) == "train"
    assert not torch.equal(rows[0], rows[1])


def test_iter_packed_rows_is_endless_and_seeded():
    it = dyck.iter_packed_rows(2, 64, seed=5)
    a, b = next(it), next(it)
    assert a.shape == b.shape == (2, 64) and not torch.equal(a, b)
    assert torch.equal(a, next(dyck.iter_packed_rows(2, 64, seed=5)))


def numbered_pieces(lengths):
    """Pieces whose bytes say which piece they are: piece i is `lengths[i]` copies of byte
    i + 1 (so a row's body splits into pieces by runs, and each run names its piece)."""
    return iter([bytes([i + 1]) * n for i, n in enumerate(lengths)])


def runs(body):
    """(byte, run length) for each maximal run of equal bytes."""
    return [(k, len(list(g))) for k, g in itertools.groupby(body)]


def test_pack_whole_places_pieces_whole_in_stream_order_with_waiting():
    rng = random.Random(1)
    lengths = [rng.randint(1, 40) for _ in range(250)]
    rows = packing.pack_whole(numbered_pieces(lengths), 30, 48)
    assert rows.shape == (30, 48) and (rows[:, 0] == BOS_ID).all()
    placed = []
    for row in rows.tolist():
        body = row[1:]
        real = [t for t in body if t != PAD_ID]
        assert body[: len(real)] == real  # padding only at the end
        for piece, length in runs(real):
            assert length == lengths[piece - 1]  # whole: never cut, never split
            placed.append(piece - 1)
    assert len(set(placed)) == len(placed)  # each piece once
    # nothing drawn is lost but what still waits at the end (at most 8)
    drawn = max(placed) + 1
    assert len(set(range(drawn)) - set(placed)) <= 8
    assert placed != sorted(placed)  # some pieces waited (rows of 47 tokens, pieces up to 40)
    assert sum(t != PAD_ID for t in rows[:, 1:].flatten().tolist()) > 0.75 * 30 * 47


def test_pack_whole_on_a_hand_worked_case():
    # width 32, at most 2 waiting. Row 0: p0 (10), p1 (10); p2 (30) waits; p3 (5) fits; p4
    # (20) waits, and with 2 waiting no more are drawn. Row 1: waiting first, oldest first: p2
    # fits, p4 does not; 2 tokens left, under the shortest piece seen (5). Row 2: p4, then p5
    # (8) drawn and placed; 4 left < 5. p6 is never drawn.
    rows = packing.pack_whole(numbered_pieces([10, 10, 30, 5, 20, 8, 8]), 3, 33, max_waiting=2)
    bodies = [runs(row[1:]) for row in rows.tolist()]
    assert bodies == [
        [(1, 10), (2, 10), (4, 5), (PAD_ID, 7)],
        [(3, 30), (PAD_ID, 2)],
        [(5, 20), (6, 8), (PAD_ID, 4)],
    ]


def test_pack_whole_rejects_a_piece_longer_than_a_row():
    with pytest.raises(DataError, match="cannot fill a row of 16 whole"):
        packing.pack_whole(numbered_pieces([4, 20]), 2, 16)


def test_whole_dyck_rows_hold_only_complete_correct_examples():
    spec = dyck.DyckSpec(max_depth=30, max_len=60)
    rows = dyck.packed_rows(6, 200, seed=2, spec=spec, whole=True)
    cut = dyck.packed_rows(6, 200, seed=2, spec=spec)
    assert (rows[:, 0] == BOS_ID).all() and (rows == PAD_ID).any() and not (cut == PAD_ID).any()
    for row in rows:
        text = TOK.decode([t for t in row.tolist() if t != PAD_ID])
        assert text.endswith("\n")  # the row ends with a whole example
        for line in text.split("\n")[:-1]:
            prefix, answer = LINE.match(line).groups()
            # closers only, and they balance the prefix: the shortest completion
            assert balanced(f"{prefix} {answer}") and set(answer) <= set(")]}> ")


def test_training_data_packs_whole_dyck_examples_when_asked():
    kw = dict(data={"dyck": 1.0}, seq_len=128, batch_size=4, dyck={"max_depth": 12, "max_len": 40})
    whole = TrainingData(TrainConfig.from_dict({**kw, "dyck_packing": "whole"}))
    cut = TrainingData(TrainConfig.from_dict(kw))
    assert (whole.batch_at(0) == PAD_ID).any() and not (cut.batch_at(0) == PAD_ID).any()
    assert (whole.heldout("dyck", 4) == PAD_ID).any()  # held-out rows packed as trained
    for row in whole.batch_at(0):
        assert TOK.decode([t for t in row.tolist() if t != PAD_ID]).endswith("\n")
    with pytest.raises(ConfigError, match="dyck_packing must be one of cut, whole"):
        TrainConfig.from_dict({**kw, "dyck_packing": "half"})


class FakeDyckModel:
    """Stands in for the transformer: greedy generation with a correct (independent) solver.
    Records every batch it is given."""

    def __init__(self, max_seq_len=512, wrong=False):
        self.cfg = SimpleNamespace(max_seq_len=max_seq_len)
        self.wrong = wrong
        self.calls = []

    def generate(self, tokens, max_new_tokens, temperature=0.0):
        assert tokens.dtype == torch.long and tokens.dim() == 2 and temperature == 0.0
        assert tokens.shape[1] + max_new_tokens <= self.cfg.max_seq_len
        self.calls.append(tokens.clone())
        rows = []
        for row in tokens.tolist():
            assert row[0] == BOS_ID and PAD_ID not in row
            text = TOK.decode(row)
            assert text.endswith(" Output: ")
            prefix = text.rsplit("Input: ", 1)[1][: -len(" Output: ")]
            answer = ")" if self.wrong else brute_force_answer(prefix)
            new = TOK.encode(answer + "\n( ( junk", bos=False) + [EOS_ID] * max_new_tokens
            rows.append(row + new[:max_new_tokens])
        return torch.tensor(rows, dtype=torch.long)


def test_complete_with_fake_model():
    model = FakeDyckModel()
    assert dyck_eval.complete(model, "( [ {") == "} ] )"
    assert model.calls[-1].shape[0] == 1
    assert TOK.decode(model.calls[-1][0]) == "Input: ( [ { Output: "
    assert dyck_eval.complete(model, "<({") == "} ) >"
    assert dyck_eval.complete(model, "( [", demos=["{ <", ("(", ")")]) == "] )"
    assert TOK.decode(model.calls[-1][0]).count("\n") == 2


@pytest.mark.parametrize("bad", ["( a [", "( ]", ") (", "( )", "", "   ", "( \ud800"])
def test_complete_rejects_bad_input_in_one_line(bad):
    with pytest.raises(DataError) as info:
        dyck_eval.complete(FakeDyckModel(), bad)
    assert str(info.value) and "\n" not in str(info.value)


def test_complete_refuses_prompt_longer_than_model():
    with pytest.raises(DataError, match="max_seq_len"):
        dyck_eval.complete(FakeDyckModel(max_seq_len=16), "( [ { < ( [ {")


def test_exact_match_accuracy_batches_by_length():
    examples = dyck.make_dataset(
        30, spec=dyck.DyckSpec(max_len=10), n_demos=1, seed=4, split="heldout"
    )
    model = FakeDyckModel()
    assert dyck_eval.exact_match_accuracy(model, examples, batch_size=4) == 1.0
    assert sum(c.shape[0] for c in model.calls) == 30 and max(c.shape[0] for c in model.calls) <= 4
    wrong = FakeDyckModel(wrong=True)
    expected = sum(ex.answer == ")" for ex in examples) / 30
    assert dyck_eval.exact_match_accuracy(wrong, examples) == pytest.approx(expected)
    assert dyck_eval.complete_many(model, examples[:3]) == [ex.answer for ex in examples[:3]]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(n_pairs=0),
        dict(n_pairs=5),
        dict(max_depth=0),
        dict(min_len=8, max_len=4),
        dict(p_open=1.0),
        dict(n_pairs="x"),
        dict(split="test"),
    ],
)
def test_bad_dataset_arguments(kwargs):
    split = kwargs.pop("split", "train")
    with pytest.raises(DataError) as info:
        dyck.make_dataset(2, spec=dyck.DyckSpec(**kwargs), split=split)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("max_seq_len, n_demos", [(64, 0), (64, 1), (128, 2), (512, 4), (97, 3)])
def test_dyck_max_len_is_the_longest_word_that_fits(max_seq_len, n_demos):
    """Every example built at the returned length leaves a position free; two brackets more
    can overflow (worst case: every word at full length)."""
    longest = dyck.dyck_max_len(max_seq_len, n_demos, max_len=1000)
    assert longest % 2 == 0 and longest >= 2

    def worst(length):  # n_demos demonstrations and a query, all of `length` brackets
        prefix = " ".join("(" * (length // 2))  # closed by as many brackets
        return len(dyck.build_example(prefix, [prefix] * n_demos).ids)

    assert worst(longest) <= max_seq_len - 1 < worst(longest + 2)
    assert dyck.dyck_max_len(max_seq_len, n_demos) == min(20, longest)
    assert dyck.dyck_max_len(20, 1) < 2  # nothing fits


def _perfect_predictions(examples):
    """Argmax ids a flawless model would give: each next token, then a newline after the answer."""
    tokens, _ = dyck.dyck_batch(examples)
    pred = torch.full_like(tokens, ord("x"))
    pred[:, :-1] = tokens[:, 1:]
    for row, ex in enumerate(examples):
        pred[row, ex.answer_span[1] - 1] = ord("\n")
    return tokens, pred


def test_teacher_forced_scores_count_answer_tokens_and_need_the_stop():
    examples = dyck.make_dataset(
        4, spec=dyck.DyckSpec(max_len=10), n_demos=1, seed=2, split="heldout"
    )
    spans = [ex.answer_span for ex in examples]
    sizes = [end - start for start, end in spans]
    tokens, pred = _perfect_predictions(examples)
    right, exact = dyck_eval.answer_scores(pred, tokens, spans)
    assert right.tolist() == sizes and exact.all()
    logits = torch.nn.functional.one_hot(pred, 259).float()  # logits work the same as ids
    assert torch.equal(dyck_eval.answer_scores(logits, tokens, spans)[1], exact)
    wrong_token, no_stop = pred.clone(), pred.clone()
    wrong_token[0, spans[0][0] - 1] = ord("]") if examples[0].answer[0] != "]" else ord(")")
    no_stop[1, spans[1][1] - 1] = ord(")")  # the answer, then more brackets
    right, exact = dyck_eval.answer_scores(wrong_token, tokens, spans)
    assert right.tolist() == [sizes[0] - 1, *sizes[1:]] and exact.tolist() == [0, 1, 1, 1]
    right, exact = dyck_eval.answer_scores(no_stop, tokens, spans)
    assert right.tolist() == sizes and exact.tolist() == [1, 0, 1, 1]
    for stop in (EOS_ID, PAD_ID, BOS_ID):
        no_stop[1, spans[1][1] - 1] = stop
        assert dyck_eval.answer_scores(no_stop, tokens, spans)[1].all()


def test_teacher_forced_exact_match_batches_a_model():
    examples = dyck.make_dataset(
        5, spec=dyck.DyckSpec(max_len=10), n_demos=1, seed=6, split="heldout"
    )
    _, pred = _perfect_predictions(examples)
    flawless = {ex.ids: p[: len(ex.ids)] for ex, p in zip(examples, pred)}
    flawless[examples[3].ids][-1] = ord(")")  # example 3: right answer, then no stop

    def model(batch):  # one-hot logits of those predictions, padding predicting PAD
        out = torch.full_like(batch, PAD_ID)
        for row, ids in enumerate(batch.tolist()):
            ids = tuple(i for i in ids if i != PAD_ID)
            out[row, : len(ids)] = flawless[ids]
        return torch.nn.functional.one_hot(out, 259).float()

    got = dyck_eval.teacher_forced_exact_match(model, examples, batch_size=2)
    assert got == [True, True, True, False, True]


# ----- nesting depth and depth-stratified held-out sets -----------------------------------------
def _slow_depth(text: str) -> int:
    """Reference: the depth after each prefix of the brackets, maximised."""
    brackets = text.split()
    return max(
        (
            sum(b in "([{<" for b in brackets[:i]) - sum(b in ")]}>" for b in brackets[:i])
            for i in range(len(brackets) + 1)
        ),
        default=0,
    )


def test_nesting_depth_by_hand():
    assert dyck.nesting_depth("( [ ] ( ( ) ) )") == 3
    assert dyck.nesting_depth("( ) ( ) [") == 1
    assert dyck.nesting_depth("") == 0
    rng = random.Random(3)
    spec = dyck.DyckSpec(n_pairs=4, max_depth=30, max_len=100)
    for _ in range(200):
        prefix = dyck.random_prefix(rng, spec)
        assert dyck.nesting_depth(prefix) == _slow_depth(prefix) <= 30
    with pytest.raises(DataError, match="not a bracket"):
        dyck.nesting_depth("( x )")


def test_depth_buckets_cover_every_depth_once():
    assert dyck.bucket_label(dyck.depth_bucket(1)) == "1-8"
    assert dyck.bucket_label(dyck.depth_bucket(8)) == "1-8"
    assert dyck.bucket_label(dyck.depth_bucket(9)) == "9-15"
    assert dyck.bucket_label(dyck.depth_bucket(24)) == "16-24"
    assert dyck.bucket_label(dyck.depth_bucket(25)) == "25+"
    for depth in range(1, 60):
        holding = [b for b in dyck.DEPTH_BUCKETS if b[0] <= depth <= (b[1] or depth)]
        assert holding == [dyck.depth_bucket(depth)]
    with pytest.raises(DataError, match=">= 1"):
        dyck.depth_bucket(0)


def test_depth_stratified_dataset_fills_each_reachable_range():
    kwargs = {"spec": dyck.DyckSpec(max_depth=30, max_len=100), "split": "heldout", "seed": 5}
    examples = dyck.make_dataset(4, n_demos=1, by_depth=True, **kwargs)
    labels = [dyck.bucket_label(dyck.depth_bucket(_slow_depth(ex.query))) for ex in examples]
    assert labels == [label for label in ("1-8", "9-15", "16-24", "25+") for _ in "1234"]
    assert all(ex.split == "heldout" and ex.n_demos == 1 for ex in examples)
    assert all(ex.answer == dyck.closing_sequence(ex.query) for ex in examples)
    again = dyck.make_dataset(4, n_demos=1, by_depth=True, **kwargs)
    assert [ex.ids for ex in again] == [ex.ids for ex in examples]
    # ranges beyond the spec's depth (max_depth 12) or length (max_len 12: <= 6 open) are left out
    shallow = dyck.make_dataset(3, spec=dyck.DyckSpec(max_depth=12, max_len=100), by_depth=True)
    assert sorted({dyck.depth_bucket(ex.depth) for ex in shallow}) == [(1, 8), (9, 15)]
    short = dyck.make_dataset(3, spec=dyck.DyckSpec(max_depth=30, max_len=12), by_depth=True)
    assert {ex.depth for ex in short} <= set(range(1, 7))
    assert dyck.make_dataset(0, by_depth=True) == []
