"""The named held-out Dyck draws: the validation draw (for choosing) and the test draw (for
reporting) share no word, at the default size and in a word space so small that two random
draws collide; neither holds a training word (checked against an independent BLAKE2b of the
split rule); each is the same on every call and in another process; the validation draw keeps
the held-out words every figure was measured on before the two were told apart."""

from __future__ import annotations

import hashlib

import pytest

from smelt_interp.data import dyck, dyck_draws
from smelt_interp.data.dyck import TASK_DYCK, DyckSpec
from smelt_interp.data.dyck_draws import TEST, VALIDATION
from smelt_interp.errors import DataError

DEFAULT_WORDS = 1000  # the seeds command's default count
# Dyck-2 words of at most 8 brackets nesting at most 3 deep (dyck-pair-tiny's spec): about 50
# held-out inputs, so two draws of 40 words share most of theirs
TINY = DyckSpec(n_pairs=2, max_depth=3, min_len=2, max_len=8)


def held_out_by_hand(word: str) -> bool:
    """The split rule written out: a query input is held out when the BLAKE2b-64 of
    'dyck:' + its space-separated brackets, as a fraction of 2^64, is below 0.1."""
    digest = hashlib.blake2b(f"dyck:{' '.join(word.split())}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < 0.1


def words_of(examples: list[dyck.DyckExample]) -> set[str]:
    """Every bracket input an example set shows a model: queries and demonstrations."""
    return {ex.query for ex in examples} | {prefix for ex in examples for prefix, _ in ex.demos}


@pytest.fixture(scope="module")
def default_draws() -> tuple[list[str], list[str]]:
    return (
        dyck_draws.draw_words(VALIDATION, DEFAULT_WORDS, TASK_DYCK),
        dyck_draws.draw_words(TEST, DEFAULT_WORDS, TASK_DYCK),
    )


def test_the_draws_share_no_word_at_the_default_size(default_draws):
    validation, test = default_draws
    assert len(validation) == len(test) == DEFAULT_WORDS
    assert not set(validation) & set(test)
    # two independent streams of this size do collide (short words): the drop is what keeps
    # the draws apart, not luck
    other = dyck_draws.draw_words(
        VALIDATION, DEFAULT_WORDS, TASK_DYCK, seed=dyck_draws.DRAW_SEED + 1
    )
    assert set(other) & set(validation)
    assert all(held_out_by_hand(w) for w in validation + test)  # neither meets the training words
    assert all(dyck.open_stack(w) for w in test)  # unclosed prefixes, as the task asks


def test_the_validation_draw_keeps_the_words_figures_were_measured_on(default_draws):
    """The words of every held-out set before the draws were named (make_dataset, split
    'heldout', seed 2026): the old figures stay the validation draw's."""
    old = dyck.make_dataset(DEFAULT_WORDS, spec=TASK_DYCK, split="heldout", seed=2026)
    assert default_draws[0] == [ex.query for ex in old]
    with_demos = dyck.make_dataset(30, spec=TINY, n_demos=2, split="heldout", seed=7)
    assert dyck_draws.heldout_draw(VALIDATION, 30, TINY, n_demos=2, seed=7) == with_demos


def test_the_draws_share_no_word_where_collisions_are_certain():
    validation = dyck_draws.draw_words(VALIDATION, 40, TINY)
    again = dyck_draws.draw_words(VALIDATION, 40, TINY, seed=dyck_draws.DRAW_SEED + 1)
    assert len(set(validation) & set(again)) >= 5  # random draws of this space collide
    test = dyck_draws.draw_words(TEST, 40, TINY)
    assert len(test) == 40 and not set(test) & set(validation)
    assert all(held_out_by_hand(w) for w in test)
    # with demonstrations: no query or demonstration of one draw is in the other
    shown = dyck_draws.heldout_draw(VALIDATION, 10, TINY, n_demos=3)
    told = dyck_draws.heldout_draw(TEST, 10, TINY, n_demos=3)
    assert all(ex.n_demos == 3 for ex in told) and not words_of(shown) & words_of(told)
    # kept apart from a larger validation draw than itself when asked
    small = dyck_draws.draw_words(TEST, 5, TINY, apart_from=40)
    assert not set(small) & set(validation)
    short = dyck_draws.heldout_draw(TEST, 2, TINY, n_demos=3, apart_from=10)
    assert not words_of(short) & words_of(shown)


def test_each_draw_is_the_same_on_every_call_and_differs_by_seed():
    for draw in dyck_draws.DRAWS:
        first = dyck_draws.heldout_draw(draw, 20, TASK_DYCK, n_demos=1)
        assert dyck_draws.heldout_draw(draw, 20, TASK_DYCK, n_demos=1) == first
        assert dyck_draws.heldout_draw(draw, 20, TASK_DYCK, n_demos=1, seed=5) != first


# The first words of each draw at the default seed, as another process (PYTHONHASHSEED=7)
# drew them: a draw that changed, or that went through Python's salted hash(), moves every
# figure reported on it.
FIRST_WORDS = {
    VALIDATION: ["{ [ ] } < > < [ < < > > ] > { ( { [ ] < ("],
    TEST: ["{ < ( ) < > > ( ) < ( ( ( ) < < > [ < > ] > [ ( [ < <"],
}


def test_each_draw_is_the_one_another_process_drew():
    for draw, words in FIRST_WORDS.items():
        assert dyck_draws.draw_words(draw, len(words), TASK_DYCK) == words


def test_a_space_too_small_for_both_draws_is_one_error():
    only = DyckSpec(n_pairs=1, max_depth=3, min_len=2, max_len=8)  # a handful of held-out inputs
    with pytest.raises(DataError, match="too small for both draws"):
        dyck_draws.draw_words(TEST, 5, only, apart_from=200)
    with pytest.raises(DataError, match="unknown held-out draw 'train'"):
        dyck_draws.draw_words("train", 5, TINY)
    with pytest.raises(DataError, match="must be >= 0"):
        dyck_draws.heldout_draw(TEST, -1, TINY)
