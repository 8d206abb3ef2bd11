"""ByteTokenizer: UTF-8 round trips, specials, and one-line errors for text it cannot encode."""

import pytest
import torch

from smelt_interp.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer
from smelt_interp.errors import DataError, TokenizerError

TOK = ByteTokenizer()


@pytest.mark.parametrize(
    "text", ["", "hello", "( [ { } ] )", "héllo — 世界 🙂", "tab\tnew\nline", "\x00\x7f"]
)
def test_round_trip(text):
    ids = TOK.encode(text, bos=True, eos=True)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID
    assert ids[1:-1] == list(text.encode("utf-8"))  # independent reference: Python's UTF-8
    assert all(0 <= i < VOCAB_SIZE for i in ids)
    assert TOK.decode(ids) == text


def test_non_ascii_is_multi_byte():
    assert len(TOK.encode("世", bos=False)) == 3
    assert len(TOK.encode("🙂", bos=False)) == 4


def test_surrogate_raises_one_line_tokenizer_error():
    with pytest.raises(TokenizerError) as info:
        TOK.encode("ok \ud800 bad")
    assert "\n" not in str(info.value) and "position 3" in str(info.value)
    assert isinstance(info.value, DataError)


def test_out_of_vocab_id_raises():
    with pytest.raises(TokenizerError):
        TOK.decode([65, VOCAB_SIZE + 5])


def test_decode_specials():
    ids = [BOS_ID, 104, 105, EOS_ID, PAD_ID]
    assert TOK.decode(ids) == "hi"
    assert TOK.decode(ids, skip_special=False) == "<bos>hi<eos><pad>"


def test_batch_right_pads():
    ids, lengths = TOK.batch(["a", "abc"])
    assert ids.dtype == torch.long and ids.shape == (2, 4)
    assert lengths.tolist() == [2, 4]
    assert ids[0].tolist() == [BOS_ID, 97, PAD_ID, PAD_ID]
