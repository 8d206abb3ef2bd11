"""The dashboard with dense model folders (adapters.dense): a folder served as it is and as
FOLDER@SPAN (looped at inference, named with its loop), its default prompt ordinary text and the
Attention note's first-token mass, and a model whose folder is still being prepared (the demo's
real model) pending on its job record until the folder appears, then served."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers.tiny_looped import tiny_tokenizer  # noqa: E402

from smelt_interp.app import default_prompts  # noqa: E402
from smelt_interp.app.jobs import JobRunner, real_lm_job  # noqa: E402
from smelt_interp.app.pages.attention import sink_line  # noqa: E402
from smelt_interp.app.prompt_run import run_prompt  # noqa: E402
from smelt_interp.app.registry import ModelRegistry, find_checkpoints  # noqa: E402
from smelt_interp.app.served import Served  # noqa: E402
from smelt_interp.errors import CheckpointError  # noqa: E402


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a byte-level tokenizer (adds a BOS) and 512 positions."""
    tok = tiny_tokenizer()
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=48,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("dense") / "tiny-llama"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def test_a_folder_is_served_as_it_is_and_looped(llama_folder: Path) -> None:
    paths = find_checkpoints([llama_folder, f"{llama_folder}@1:3x3"])
    assert list(paths) == ["tiny-llama", "tiny-llama@1:3x3"]
    served = Served(ModelRegistry(paths))
    plain, looped = (served.registry.cfg(n) for n in paths)
    assert not plain.is_looped and looped.loop_text == "layers 1..2 x 3"
    assert looped.effective_depth == 4 + 2 * 2 and served.registry.looped == ["tiny-llama@1:3x3"]
    for name in paths:
        prompt = default_prompts.default_prompt_for(served, name)
        assert prompt == default_prompts.TEXT_PROMPT  # ordinary text, not a Dyck example
        run = run_prompt(served.registry, name, prompt)
        cfg = served.registry.cfg(name)
        line = sink_line(run, cfg, 2, cfg.visits_of(2) - 1, 0)
        mean = float(run.bos_share(2, cfg.visits_of(2) - 1).mean())
        assert f"all 4 heads of layer 2, visit {cfg.visits_of(2) - 1}: {mean:.0%}" in line
    with pytest.raises(CheckpointError, match="needs a transformers model folder"):
        find_checkpoints([f"{llama_folder / 'model.safetensors'}@1:3"])


def test_a_model_being_prepared_is_pending_until_its_folder_appears(
    llama_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "models" / "real"
    job = real_lm_job(target)
    runner = JobRunner([job], command=["true"]).queue()  # recorded as queued, never started
    registry = ModelRegistry({"real": target, "tiny": llama_folder}, jobs={"real": job.run_dir})
    assert registry.names == ["tiny"]
    ((name, progress),) = registry.pending()
    assert name == "real" and progress.state == "queued" and progress.run_dir == job.run_dir
    shutil.copytree(llama_folder, target)  # the preparation renames a complete folder in
    assert registry.names == ["real", "tiny"] and registry.pending() == []
    runner.stop()
