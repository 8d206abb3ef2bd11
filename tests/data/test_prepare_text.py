"""`prepare` on JSONL text that no tokenizer can encode: a JSON escape spelling a lone
surrogate is one DataError line naming the file and line, for bytes and BPE alike."""

from __future__ import annotations

import pytest
from helpers.bad_input import assert_one_line_error, run_command

from smelt_interp.data.prepare import prepare
from smelt_interp.errors import DataError


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe:300"])
def test_a_lone_surrogate_in_jsonl_is_one_line(tmp_path, tokenizer):
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "fine text"}\n{"text": "bad \\ud800 here"}\n')
    with pytest.raises(DataError, match=r"docs.jsonl:2: 'text' cannot encode .* position 4"):
        prepare([str(src)], tmp_path / "out", tokenizer)
    code, _, err = run_command(
        "smelt_interp.data",
        "prepare",
        src,
        "--out",
        tmp_path / "out2",
        "--tokenizer",
        tokenizer,
        "--quiet",
    )
    assert_one_line_error(code, err, "docs.jsonl:2", "not valid unicode")
