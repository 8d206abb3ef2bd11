"""The two named held-out draws of Dyck words. Held-out words are drawn twice over: a
validation draw for choosing (the trainer's periodic evaluation, recipe sweeps) and a test draw
for reporting (the seeds command, the probes' Dyck prompts), so a reported figure is not measured
on the words that chose what it reports. Both take only held-out words (query_split), so neither
meets the training stream, whatever the seeds. They come from different random streams: the
validation draw from Random(seed), as every held-out set was drawn before the two were told apart
(so old figures stay comparable), the test draw from a string-seeded stream that no integer seed
reaches. A test word that the validation draw of the same spec and seed holds is dropped and
drawn again, so the two share no word by construction."""

from __future__ import annotations

import random

from smelt_interp.data.dyck import MAX_TRIES, DyckExample, DyckSpec, build_example, sample_prefix
from smelt_interp.errors import DataError

VALIDATION, TEST = "validation", "test"
DRAWS: tuple[str, ...] = (VALIDATION, TEST)
DRAW_SEED = 2026  # the seed both draws use unless a caller names another
_TEST_STREAM = "dyck-test"


def check_draw(draw: str) -> str:
    """Validate a draw name, raising DataError with the names there are."""
    if draw not in DRAWS:
        raise DataError(f"unknown held-out draw {draw!r}; expected one of {', '.join(DRAWS)}")
    return draw


def draw_words(
    draw: str,
    n_words: int,
    spec: DyckSpec,
    *,
    seed: int = DRAW_SEED,
    apart_from: int | None = None,
) -> list[str]:
    """The first `n_words` held-out query inputs (unclosed prefixes) of the named draw of
    `spec`. The test draw leaves out every word among the validation draw's first `apart_from`
    words (default `n_words`) of the same spec and seed; DataError when too few held-out words
    are left to draw from."""
    check_draw(draw)
    if n_words < 0:
        raise DataError(f"n_words must be >= 0, got {n_words}")
    if draw == VALIDATION:
        rng = random.Random(seed)
        return [sample_prefix(rng, spec, "heldout") for _ in range(n_words)]
    apart = n_words if apart_from is None else apart_from
    if apart < 0:
        raise DataError(f"apart_from must be >= 0, got {apart}")
    taken = set(draw_words(VALIDATION, apart, spec, seed=seed))
    rng = random.Random(f"{_TEST_STREAM}:{seed}")
    words: list[str] = []
    misses = 0
    while len(words) < n_words:
        word = sample_prefix(rng, spec, "heldout")
        if word not in taken:
            words.append(word)
            misses = 0
            continue
        misses += 1
        if misses >= MAX_TRIES:
            raise DataError(
                f"no held-out Dyck input outside the validation draw's {apart} words found in "
                f"{MAX_TRIES} draws; the input space of {spec} is too small for both draws"
            )
    return words


def heldout_draw(
    draw: str,
    n: int,
    spec: DyckSpec,
    *,
    n_demos: int = 0,
    seed: int = DRAW_SEED,
    apart_from: int | None = None,
) -> list[DyckExample]:
    """`n` in-context examples of the named held-out draw of `spec`: each takes the draw's next
    `n_demos` words as demonstrations, then its next word as the query. The validation draw's
    examples are make_dataset's held-out ones of the same seed. The test draw's words are apart
    from those of the validation draw's first `apart_from` examples (default `n`) of the same
    spec, demonstration count and seed."""
    if n < 0 or n_demos < 0:
        raise DataError(f"n and n_demos must be >= 0, got n={n}, n_demos={n_demos}")
    per = n_demos + 1
    apart = None if apart_from is None else apart_from * per
    words = draw_words(draw, n * per, spec, seed=seed, apart_from=apart)
    return [
        build_example(words[i + n_demos], words[i : i + n_demos]) for i in range(0, n * per, per)
    ]
