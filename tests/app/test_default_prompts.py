"""The prompt a page opens on: each served model's own task, fitting its context. A 64-token
recall model gets a held-out recall row of its spec (not the 81-token Dyck example that made the
demo's first view an error), a Dyck model an in-context example with as many demonstrations as
fit (two where they do: the example every page opened on before), a context too short for any
example still a prompt that runs; and the note beside the prompt box names the context."""

from __future__ import annotations

import pytest
from helpers.demo_models import RECALL, demo_checkpoints

from smelt_interp.app import default_prompts
from smelt_interp.app.default_prompts import default_prompt_for
from smelt_interp.app.prompt_run import context_note, run_prompt
from smelt_interp.app.registry import ModelRegistry
from smelt_interp.app.served import Served
from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_rows
from smelt_interp.data.dyck import DyckSpec, make_dataset
from smelt_interp.data.prompt_text import encode_prompt
from smelt_interp.data.tokenizer import ByteTokenizer
from smelt_interp.provenance import Provenance


@pytest.fixture
def demo_like(tmp_path) -> Served:
    return Served(ModelRegistry(demo_checkpoints(tmp_path)))


def test_each_model_opens_on_its_own_task_within_its_context(demo_like):
    wb = demo_like
    for name in wb.registry.names:
        prompt = default_prompt_for(wb, name)
        ctx = wb.registry.cfg(name).max_seq_len
        assert len(encode_prompt(prompt, ctx, wb.registry.tokenizer(name))) <= ctx
        assert run_prompt(wb.registry, name, prompt).n_tokens <= ctx  # it runs
        if name.endswith("-recall"):  # held-out row 0 of the model's own recall spec
            row = recall_rows(1, 64, seed=0, split="heldout", spec=AssocRecallSpec(**RECALL))
            assert prompt == bytes(row[0, 1:].tolist()).decode("latin-1")
        else:
            assert prompt.count("Input: ") == 3 and prompt.count("Output: ") == 3  # two demos
    assert default_prompt_for(wb, None) == default_prompt_for(wb, wb.registry.valid(None))
    assert context_note(wb, "smelt-recall") == "smelt-recall reads at most 64 tokens, BOS included."


def test_a_dyck_model_with_room_gets_the_two_demonstration_example():
    words = DyckSpec(n_pairs=4, max_depth=4, max_len=10)
    before = make_dataset(1, spec=words, n_demos=2, seed=3, split="heldout")[0].text
    assert default_prompts.default_prompt(Provenance("x", None), 512, ByteTokenizer()) == before


@pytest.mark.parametrize("ctx", [8, 16, 24, 40, 64])
def test_short_contexts_get_fewer_demonstrations_or_a_bare_prefix(ctx):
    prompt = default_prompts.default_prompt(Provenance("x", None), ctx, ByteTokenizer())
    assert len(ByteTokenizer().encode(prompt)) <= ctx
    n_lines = prompt.count("\n")
    assert n_lines <= default_prompts.DEMOS


def test_a_recall_checkpoint_without_its_spec_falls_back_to_dyck():
    recall_without_spec = Provenance("x", {"data": {"assoc_recall": 1.0}})
    prompt = default_prompts.default_prompt(recall_without_spec, 128, ByteTokenizer())
    assert "Output:" in prompt
