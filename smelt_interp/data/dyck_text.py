"""A Dyck prompt as a person types it: one bracket prefix per line, demonstrations first and the
query last, read into a DyckExample of a model's tokens, and a held-out prompt drawn as such
text. Every message is a PromptError a page can show."""

from __future__ import annotations

from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.dyck import DyckExample, DyckSpec, build_example, dyck_max_len, make_dataset
from smelt_interp.data.dyck_tokens import encode_example
from smelt_interp.data.tokenizer import ByteTokenizer
from smelt_interp.errors import DataError, PromptError, TokenizerError


def parse_dyck_lines(text: str | None) -> tuple[str, list[str]]:
    """'demo\\n...\\nquery' -> (query, demos): one bracket prefix per non-empty line, the last
    the query. Lines may be written 'Input: ( [ Output: ] )' too (the part after Input:)."""
    lines = []
    for raw in (text or "").splitlines():
        line = raw.strip()
        if line.startswith("Input:"):
            line = line[len("Input:") :].split("Output:")[0]
        if line.strip():
            lines.append(line.strip())
    if not lines:
        raise PromptError("Type at least one line of brackets (the query), e.g. '( [ {'.")
    return lines[-1], lines[:-1]


def generate_dyck(pairs: int, depth: int, demos: int, seed: int, max_seq_len: int) -> str:
    """A held-out in-context prompt as page text: demonstrations' inputs then the query, one a
    line; words short enough that the whole example fits `max_seq_len`."""
    longest = dyck_max_len(max_seq_len, demos)
    if longest < 2:
        raise PromptError(
            f"{demos} demonstrations do not fit the model's {max_seq_len} tokens; use fewer."
        )
    try:
        ex = make_dataset(
            1,
            spec=DyckSpec(
                n_pairs=pairs, max_depth=max(1, min(depth, longest // 2)), max_len=longest
            ),
            n_demos=demos,
            seed=seed,
            split="heldout",
        )[0]
    except DataError as exc:
        raise PromptError(str(exc)) from None
    return "\n".join([p for p, _ in ex.demos] + [ex.query])


def dyck_example(
    text: str | None, max_seq_len: int, tokenizer: Tokenizer | None = None
) -> DyckExample:
    """The Dyck prompt of the page's text in `tokenizer`'s tokens (default bytes; a BPE
    model's prompt and spans through data.dyck_tokens); PromptError when it is not one or does
    not fit."""
    query, demos = parse_dyck_lines(text)
    try:
        ex = encode_example(build_example(query, demos), tokenizer or ByteTokenizer())
    except (DataError, TokenizerError) as exc:
        raise PromptError(f"Not a usable Dyck prompt: {exc}") from None
    if len(ex.ids) > max_seq_len:
        raise PromptError(
            f"This example is {len(ex.ids)} tokens long; the model allows {max_seq_len}. "
            f"Use fewer or shorter demonstrations."
        )
    return ex
