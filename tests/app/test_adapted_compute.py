"""The dashboard's computations on transformers model folders (helpers.tiny_looped: hrm_text,
dory, inkling2_loop, ids only), without a browser: the registry serves a folder, a prompt run
reads an adapted model's own eager pattern (whole and pooled, BOS and learned-sink shares), the
prompt box takes rows of ids, probes run on the default row of ids, a folder beside a SmeltModel
checkpoint leaves the checkpoint's numbers as they were, and the pages that have nothing to
draw for such a model say why instead of failing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.demo_models import demo_checkpoints
from helpers.tiny_looped import tiny_folders

from smelt_interp.app.default_prompts import default_ids, default_prompt_for
from smelt_interp.app.pages import attention, overview, pattern_cap, routing
from smelt_interp.app.pages.case_study import aggregate, dyck, recall, task_models
from smelt_interp.app.probe_tables import batch_description, model_tables
from smelt_interp.app.prompt_run import cached_run, context_note, prompt_labels
from smelt_interp.app.registry import ModelRegistry, find_checkpoints
from smelt_interp.app.served import Served
from smelt_interp.data.prompt_text import encode_prompt, parse_ids
from smelt_interp.data.tokenizer import ByteTokenizer
from smelt_interp.errors import PromptError
from smelt_interp.model.protocol import hook_name


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    return tiny_folders(tmp_path_factory.mktemp("folders"))


@pytest.fixture(scope="module")
def smelt_ckpt(tmp_path_factory) -> Path:
    return demo_checkpoints(tmp_path_factory.mktemp("demo"))["smelt"]


@pytest.fixture(scope="module")
def alone(folders) -> Served:
    """The three folders served together (they share the ids-only tokenizer of 64 ids)."""
    return Served(ModelRegistry(find_checkpoints(folders.values())))


@pytest.fixture(scope="module")
def mixed(folders, smelt_ckpt) -> Served:
    """inkling2_loop beside the demo's smelt checkpoint."""
    paths = {**find_checkpoints([folders["inkling2_loop"]]), "smelt": smelt_ckpt}
    return Served(ModelRegistry(paths))


def test_registry_serves_a_folder_as_one_model(folders, alone):
    assert find_checkpoints([folders["dory"]]) == {"dory": folders["dory"]}
    assert sorted(alone.registry.names) == sorted(folders)
    assert alone.registry.pair() is None  # no budget pair among adapted models
    for name in alone.registry.names:
        assert alone.registry.cfg(name).attention_source == "pattern"


def test_prompt_run_reads_the_models_eager_pattern(alone):
    """Every visit's pattern, whole and pooled, and its BOS and learned-sink shares are the
    adapter's own hook_pattern, captured in a separate forward pass."""
    for name in alone.registry.names:
        prompt = default_prompt_for(alone, name)
        run = cached_run(alone, name, prompt)
        assert run.source == "pattern" and run.ids == parse_ids(prompt)
        names = [hook_name(*lv, "attn.hook_pattern") for lv in run.schedule]
        with torch.no_grad():
            _, cache = alone.registry.get(name).run_with_cache(
                torch.tensor([run.ids]), names_filter=lambda n, names=names: n in names
            )
        pooled = pattern_cap.DrawableRun(run, side=len(run.ids))
        pooled.pooled = True  # the chunked path, on blocks of one position
        for layer, visit in run.schedule:
            want = cache[hook_name(layer, visit, "attn.hook_pattern")][0].double()
            got = torch.from_numpy(run.pattern(layer, visit)).double()
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(
                torch.from_numpy(pooled.pattern(layer, visit)).double(), want, atol=1e-6, rtol=1e-5
            )
            bos = want[:, 1:, 0].mean(dim=-1)
            slot = (1 - want[:, 1:].sum(dim=-1)).mean(dim=-1)
            for drawn in (run, pooled):
                np.testing.assert_allclose(drawn.bos_share(layer, visit), bos, atol=1e-6)
                np.testing.assert_allclose(drawn.slot_share(layer, visit), slot, atol=1e-6)
        if alone.registry.cfg(name).learned_sinks:  # inkling's sink slot takes real mass
            assert max(run.slot_share(*lv).max() for lv in run.schedule) > 0.05
        else:
            assert max(abs(run.slot_share(*lv)).max() for lv in run.schedule) < 1e-5


def test_the_prompt_box_takes_rows_of_ids(alone):
    name = "dory"
    prompt = default_prompt_for(alone, name)
    cfg = alone.registry.cfg(name)
    assert prompt == "ids: " + ",".join(map(str, default_ids(cfg.vocab_size, cfg.max_seq_len)))
    assert "ids: 1,17,42" in context_note(alone, name)
    assert prompt_labels(alone, name, "ids: 3, 4 5") == ["3", "4", "5"]
    for bad, says in (
        ("ids: 1,x", "not a token id"),
        ("ids:", "No token ids"),
        ("ids: 1,64", "outside the model's vocabulary"),
        ("ids: " + ",".join(["1"] * 65), "at most 64"),
        ("some text", "ids: 1,17,42"),  # no tokenizer: the message names the ids syntax
    ):
        with pytest.raises(PromptError, match=says):
            cached_run(alone, name, bad)
    # any model takes a row of ids, as it is (no BOS added)
    assert encode_prompt("ids: 2,3", 8, ByteTokenizer(), 300) == [2, 3]


def test_probes_run_on_the_default_row_of_ids(alone):
    for name in alone.registry.names:
        visits = model_tables(alone, "sink", name)["visits"]
        assert len(visits) == alone.registry.cfg(name).effective_depth
        assert ("sink_slot_mass" in visits) == alone.registry.cfg(name).learned_sinks
    assert model_tables(alone, "routing", "hrm_text") is None  # dense: nothing to route
    assert model_tables(alone, "routing", "inkling2_loop") is not None
    assert model_tables(alone, "case_study", "dory") is None  # no tokenizer: no text prompts
    assert "32 token ids" in batch_description(alone)


def test_a_folder_beside_a_checkpoint_leaves_its_numbers(mixed, smelt_ckpt):
    """smelt's probe tables and prompt run beside a folder equal smelt's served alone."""
    solo = Served(ModelRegistry({"smelt": smelt_ckpt}))
    for probe in ("sink", "similarity"):
        for table, frame in model_tables(solo, probe, "smelt").items():
            got = model_tables(mixed, probe, "smelt")[table]
            assert got.equals(frame), (probe, table)
    prompt = default_prompt_for(solo, "smelt")
    assert default_prompt_for(mixed, "smelt") == prompt
    a, b = cached_run(solo, "smelt", prompt), cached_run(mixed, "smelt", prompt)
    assert b.source == "qk" and not b.patterns  # SmeltModel: recomputed from Q and K
    np.testing.assert_array_equal(a.pattern(1, 1), b.pattern(1, 1))
    assert "for smelt" in batch_description(mixed)
    assert "for inkling2_loop" in batch_description(mixed)


def test_pages_say_why_they_have_nothing_to_draw(alone, mixed):
    prompt = default_prompt_for(alone, "inkling2_loop")
    focus = attention.focus_figures(alone, "inkling2_loop", 2, 1, 0, True, prompt)
    assert "on its learned sink" in focus[2] and "adds no BOS" in focus[2]
    msg = routing.token_figure(alone, "hrm_text", 0, default_prompt_for(alone, "hrm_text"))
    assert "no routed experts" in msg[0].layout.annotations[0].text and msg[1] == ""
    assert "no routed experts" in routing.usage_figure(alone, "dory").layout.annotations[0].text
    fig, lines, *_ = aggregate.aggregate(alone, "dyck", None)
    assert "no tokenizer" in lines[0]
    results = dyck.results(alone, "( [")
    assert results[-1] == {"display": "none"}  # no error message
    note, _, fig, _ = recall.recall_view(alone, "dory", 0, None, None, None, None)
    assert "no tokenizer" in note
    assert "no tokenizer" in str(task_models(mixed))
    page = str(overview.layout(mixed, {}))
    assert "Budgets apply to SMELT/Baseline configs only: inkling2_loop" in page
    assert mixed.registry.pair() is None
