"""A prompt box's text as token ids and token ids as labels: text through the model's
tokenizer, or a row of ids written `ids: 1,17,42`, which any model takes and a model folder
without a tokenizer needs. Every message is a PromptError a page can show."""

from __future__ import annotations

import re

from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.folder_tokenizer import IdsTokenizer
from smelt_interp.data.tokenizer import ByteTokenizer
from smelt_interp.errors import PromptError, TokenizerError

TOKENIZER = ByteTokenizer()
MAX_ID_DIGITS = 12  # no vocabulary has an id of more digits
IDS_PREFIX = "ids:"  # a prompt written as token ids: "ids: 1,17,42"
IDS_SYNTAX = (
    "Or give the row as token ids: 'ids: 1,17,42' (comma- or space-separated, taken as the "
    "whole row, no BOS added)."
)


def display_labels(ids: list[int], tokenizer: Tokenizer = TOKENIZER) -> list[str]:
    """The tokenizer's labels (the model's own: a BPE model's tokens decoded) with newline and
    tab drawn as visible symbols."""
    shown = {"\\x0a": "⏎", "\\x09": "⇥"}
    return [
        shown.get(label, label).replace("\n", "⏎").replace("\t", "⇥")
        for label in tokenizer.token_labels(ids)
    ]


def ids_only(tokenizer: Tokenizer) -> bool:
    """Whether the model has no tokenizer (a model folder without tokenizer.json): its prompts
    can only be rows of ids."""
    return isinstance(tokenizer, IdsTokenizer)


def is_ids_prompt(text: str | None) -> bool:
    return text is not None and str(text).strip().lower().startswith(IDS_PREFIX)


def ids_prompt(ids: list[int]) -> str:
    """The prompt box's text for a row of ids."""
    return f"{IDS_PREFIX} " + ",".join(str(int(i)) for i in ids)


def parse_ids(text: str, vocab_size: int | None = None) -> list[int]:
    """The ids of an `ids: 1,17,42` prompt, or PromptError saying what is wrong."""
    body = str(text).strip()[len(IDS_PREFIX) :]
    parts = [p for p in re.split(r"[\s,]+", body) if p]
    if not parts:
        raise PromptError("No token ids after 'ids:'; write them as 'ids: 1,17,42'.")
    bad = [p for p in parts if not re.fullmatch(r"\d+", p)]
    long = [p for p in parts if len(p) > MAX_ID_DIGITS]  # int() of 4,300 digits raises
    if not bad and long:
        raise PromptError(
            f"Token id {long[0][:12]}... ({len(long[0]):,} digits) is larger than any "
            "vocabulary. Edit the ids and run again."
        )
    if bad:
        raise PromptError(
            f"'{bad[0][:20]}' is not a token id; write the row as 'ids: 1,17,42' "
            "(whole numbers, comma- or space-separated)."
        )
    ids = [int(p) for p in parts]
    if vocab_size is not None and max(ids) >= vocab_size:
        raise PromptError(
            f"Token id {max(ids)} is outside the model's vocabulary (0..{vocab_size - 1}). "
            "Edit the ids and run again."
        )
    return ids


def encode_prompt(
    text: str | None,
    max_seq_len: int,
    tokenizer: Tokenizer = TOKENIZER,
    vocab_size: int | None = None,
) -> list[int]:
    """BOS + the prompt's tokens (or the ids of an `ids:` prompt, as they are), or PromptError
    with a message for the page. `vocab_size`: the model's, that ids must stay below."""
    if text is None or not str(text).strip():
        raise PromptError("The prompt is empty: type some text and press Run.")
    if is_ids_prompt(text):
        ids = parse_ids(str(text), vocab_size)
    else:
        try:
            ids = tokenizer.encode(str(text))
        except TokenizerError as exc:
            hint = "" if not ids_only(tokenizer) else f" {IDS_SYNTAX}"
            raise PromptError(
                f"The tokenizer cannot encode this prompt ({exc}). Edit it and run again.{hint}"
            ) from None
    if len(ids) > max_seq_len:
        raise PromptError(
            f"The prompt is {len(ids)} tokens long (with BOS), but the model allows at "
            f"most {max_seq_len}. Shorten it and run again."
        )
    return ids


def prompt_error(text: str | None, max_seq_len: int) -> str | None:
    """The page's message for a prompt it cannot use, or None."""
    try:
        encode_prompt(text, max_seq_len)
    except PromptError as exc:
        return str(exc)
    return None
