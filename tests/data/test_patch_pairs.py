"""Prompt pairs for patching (data.patch_pairs): each pair differs where its story says, the
answers are the reference solver's / the row's, and unequal user prompts are refused."""

from __future__ import annotations

import pytest
import torch

from smelt_interp.data.assoc_recall import AssocRecallSpec
from smelt_interp.data.dyck import CLOSER_OF, closing_sequence
from smelt_interp.data.patch_pairs import (
    UNKNOWN,
    changed_bracket,
    dyck_pair,
    recall_pair,
    user_pair,
)
from smelt_interp.data.tokenizer import BOS_ID, ByteTokenizer
from smelt_interp.errors import DataError


def test_changed_bracket_swaps_the_innermost_open_one() -> None:
    assert changed_bracket("( [ ] (", 2) == "( [ ] ["
    assert changed_bracket("( [ ] ( )", 2) == "[ [ ] ( )"
    assert changed_bracket("{ <", 4) == "{ ("
    assert closing_sequence(changed_bracket("( [ [", 2))[0] == ")"


def test_dyck_pair_differs_in_one_bracket_and_answers_change() -> None:
    pair = dyck_pair(6, seed=2)
    text = ByteTokenizer()
    for row in range(6):
        clean, corrupt = pair.clean[row], pair.corrupt[row]
        assert int((clean != corrupt).sum()) == 1
        pos = int(pair.position[row])
        assert clean[0] == BOS_ID and int(clean[pos]) == ord(" ")
        prompt = text.decode(clean[: pos + 1].tolist())
        query = prompt.rsplit("Input: ", 1)[1].split(" Output:")[0]
        assert int(pair.clean_answer[row]) == ord(closing_sequence(query)[0])
        twin = text.decode(corrupt[: pos + 1].tolist()).rsplit("Input: ", 1)[1]
        assert int(pair.corrupt_answer[row]) == ord(closing_sequence(twin.split(" Output:")[0])[0])
        assert pair.clean_answer[row] != pair.corrupt_answer[row]
        assert chr(int(pair.clean_answer[row])) in CLOSER_OF.values()


def test_dyck_pair_respects_the_context() -> None:
    assert int(dyck_pair(4, max_len=60).position.max()) < 60
    with pytest.raises(DataError, match="fits in 5 tokens"):
        dyck_pair(2, max_len=5)


@pytest.mark.parametrize("n_triggers", [3, 1])
def test_recall_pair_changes_what_is_recalled(n_triggers: int) -> None:
    spec = AssocRecallSpec(n_triggers=n_triggers)
    pair = recall_pair(5, length=64, spec=spec)
    for row in range(5):
        clean, corrupt, q = (
            pair.clean[row].tolist(),
            pair.corrupt[row].tolist(),
            int(pair.position[row]),
        )
        key = clean[q]
        shown = [clean[i + 1] for i in range(1, q) if clean[i] == key]
        assert shown and int(pair.clean_answer[row]) == shown[-1]
        twin_key = corrupt[q]
        twin_shown = [corrupt[i + 1] for i in range(1, q) if corrupt[i] == twin_key]
        assert twin_shown and int(pair.corrupt_answer[row]) == twin_shown[-1]
        assert pair.clean_answer[row] != pair.corrupt_answer[row]
        assert clean[q + 1 :] == corrupt[q + 1 :]


def test_user_pair_of_unequal_lengths_is_one_line() -> None:
    with pytest.raises(DataError, match="equal lengths in tokens; got 3 and 4"):
        user_pair([1, 2, 3], [1, 2, 3, 4])
    pair = user_pair([1, 2, 3], [1, 5, 3])
    assert pair.position.tolist() == [2] and pair.clean_answer.tolist() == [UNKNOWN]
    assert torch.equal(pair.clean, torch.tensor([[1, 2, 3]]))


def test_a_dyck_pair_in_a_bpe_tokenizers_tokens() -> None:
    """In a BPE model's tokens (a real LM reads no bytes): each clean row is its example's own
    encoding, its twin differs in exactly one token, and each answer is the first token of the
    example's answer in that tokenizer, at the row's last prompt position."""
    from helpers.bpe_models import tiny_bpe

    tokenizer = tiny_bpe()
    pair = dyck_pair(4, seed=2, tokenizer=tokenizer)
    for row in range(pair.n_rows):
        end = int(pair.position[row]) + 1
        clean, corrupt = pair.clean[row, :end].tolist(), pair.corrupt[row, :end].tolist()
        assert sum(a != b for a, b in zip(clean, corrupt)) == 1
        text = tokenizer.decode(clean)
        assert tokenizer.encode(text) == clean  # the tokenizer's own ids, not bytes
        assert text.startswith("Input:") and text.rstrip().endswith("Output:")
        assert int(pair.clean_answer[row]) != int(pair.corrupt_answer[row])
        assert tokenizer.decode([int(pair.clean_answer[row])]).strip() in ")]}>"
