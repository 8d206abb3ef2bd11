"""Generation on a looped model: the KV cache changes nothing (greedy, several prompts), seeded
sampling is reproducible, and prompts that cannot fit raise a one-line TokenError."""

from __future__ import annotations

import pytest
import torch

from smelt_interp.errors import TokenError


def greedy_reference(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """Argmax of a full forward pass over the whole prefix, one token at a time."""
    out = prompt
    with torch.no_grad():
        for _ in range(n):
            out = torch.cat([out, model(out)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out


@pytest.mark.parametrize("batch, length", [(1, 1), (1, 7), (3, 5)])
def test_cached_greedy_equals_uncached(make_cfg, make_model, make_tokens, batch, length) -> None:
    model = make_model(make_cfg(n_loops=3, init_std=0.3))
    prompt = make_tokens(batch, length, seed=length)
    cached = model.generate(prompt, 16)
    uncached = model.generate(prompt, 16, use_cache=False)
    assert cached.shape == (batch, length + 16)
    assert torch.equal(cached[:, :length], prompt)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached, greedy_reference(model, prompt, 16))
    assert len(set(cached[:, length:].reshape(-1).tolist())) > 1  # not a degenerate repeat


def test_seeded_sampling_is_reproducible(tiny_model, make_tokens) -> None:
    prompt = make_tokens(2, 4)

    def sample(seed: int, use_cache: bool = True) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return tiny_model.generate(prompt, 20, temperature=1.0, use_cache=use_cache, generator=gen)

    a = sample(7)
    assert torch.equal(a, sample(7))
    assert torch.equal(a, sample(7, use_cache=False))
    assert not torch.equal(a, sample(8))
    assert int(a.min()) >= 0 and int(a.max()) < tiny_model.cfg.vocab_size


def test_low_temperature_sampling_is_greedy(tiny_model, make_tokens) -> None:
    prompt = make_tokens(1, 3)
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(
        tiny_model.generate(prompt, 8, temperature=1e-6, generator=gen),
        tiny_model.generate(prompt, 8),
    )


@pytest.mark.parametrize("length, new", [(60, 5), (65, 0), (64, 1)])
def test_too_long_prompt_raises(tiny_model, make_tokens, length: int, new: int) -> None:
    with pytest.raises(TokenError) as info:
        tiny_model.generate(make_tokens(1, length), new)
    assert "max_seq_len" in str(info.value) and "\n" not in str(info.value)


def test_prompt_filling_the_context_exactly_is_allowed(tiny_model, make_tokens) -> None:
    assert tiny_model.generate(make_tokens(1, 60), 4).shape == (1, 64)


def test_out_of_vocab_prompt_raises(tiny_model) -> None:
    with pytest.raises(TokenError):
        tiny_model.generate(torch.tensor([[1, 999]]), 2)
