"""A looped architecture the adapter does not ship, added the way the guide says: a folder whose
config.json maps the Auto classes to its own modeling file (trust_remote_code, as Ouro and
Huginn do), and an Arch for its model type (register_arch). Built offline: the "remote" model
is a renamed HRM-Text, so the HrmText Arch describes it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

pytest.importorskip("transformers")

from helpers.tiny_looped import VOCAB, tiny_model  # noqa: E402

from smelt_interp.adapters import load as adapters_load  # noqa: E402
from smelt_interp.adapters import load_looped, register_arch  # noqa: E402
from smelt_interp.adapters.hrm_text import HrmText  # noqa: E402
from smelt_interp.errors import CheckpointError  # noqa: E402

MODELING = """
from transformers import HrmTextConfig, HrmTextForCausalLM


class MyLoopConfig(HrmTextConfig):
    model_type = "my_loop"


class MyLoopForCausalLM(HrmTextForCausalLM):
    config_class = MyLoopConfig
"""


class MyLoop(HrmText):
    model_types = ("my_loop",)


@pytest.fixture
def remote_folder(tmp_path: Path) -> Path:
    """A folder of the modeling file's own classes, with auto_map pointing at that file. The
    weights are written under the model's own parameter names: save_pretrained would rename
    them as HRM-Text's released files lay them out, and a folder of another model type loads
    with no renaming."""
    folder = tmp_path / "my-loop"
    folder.mkdir()
    (folder / "modeling_my_loop.py").write_text(MODELING)
    spec = importlib.util.spec_from_file_location(
        "modeling_my_loop", folder / "modeling_my_loop.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.MyLoopConfig(**tiny_model("hrm_text").config.to_diff_dict())
    config.auto_map = {
        "AutoConfig": "modeling_my_loop.MyLoopConfig",
        "AutoModelForCausalLM": "modeling_my_loop.MyLoopForCausalLM",
    }
    torch.manual_seed(0)
    model = module.MyLoopForCausalLM(config).eval()
    model.save_pretrained(folder)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    config_json = json.loads((folder / "config.json").read_text())
    assert config_json["model_type"] == "my_loop" and "auto_map" in config_json
    return folder


def test_a_remote_code_folder_needs_permission_then_an_arch(remote_folder, monkeypatch):
    with pytest.raises(CheckpointError, match="trust_remote_code"):
        load_looped(remote_folder)
    with pytest.raises(CheckpointError, match="unknown architecture 'my_loop'.*hrm_text"):
        load_looped(remote_folder, allow_remote_code=True)
    monkeypatch.setattr(adapters_load, "ARCHS", dict(adapters_load.ARCHS))
    register_arch(MyLoop())
    model = load_looped(remote_folder, allow_remote_code=True)
    assert model.cfg.arch == "my_loop"
    assert model.schedule == HrmText().schedule(model.hf.config)
    tokens = torch.randint(0, VOCAB, (2, 9))
    _, cache = model.run_with_cache(tokens)
    assert len([n for n in cache if n.endswith("hook_resid_post")]) == len(model.schedule)
    with pytest.raises(ValueError, match="known already"):
        register_arch(MyLoop())


@pytest.mark.parametrize("command", ["sink", "report"])
def test_the_commands_pass_the_permission_on(remote_folder, tmp_path, monkeypatch, command):
    from smelt_interp.probes import registry
    from smelt_interp.probes.cli import probe_main
    from smelt_interp.report import main as report_main

    monkeypatch.setattr(adapters_load, "ARCHS", dict(adapters_load.ARCHS))
    register_arch(MyLoop())
    outputs = ["--json", str(tmp_path / "out.json")]
    if command == "report":
        outputs += ["--html", str(tmp_path / "out.html")]
        run = report_main
    else:
        run = lambda argv: probe_main(registry.get(command), argv)  # noqa: E731
    argv = [str(remote_folder), "--prompt-ids", "1,2,3,4,5,6", *outputs]
    with pytest.raises(CheckpointError, match="trust_remote_code"):
        run(argv)
    assert run([*argv, "--trust-remote-code"]) == 0


def test_an_installed_package_adds_its_arch(remote_folder, monkeypatch):
    """An Arch declared as an entry point of smelt_interp.adapters is found when a folder of its
    model type is loaded, so the commands need no code of the user's own."""
    from importlib.metadata import EntryPoint

    monkeypatch.setattr(adapters_load, "ARCHS", dict(adapters_load.ARCHS))
    monkeypatch.setitem(sys.modules, "my_loop_plugin", type(sys)("my_loop_plugin"))
    sys.modules["my_loop_plugin"].ARCH = MyLoop()
    point = EntryPoint("my_loop", "my_loop_plugin:ARCH", adapters_load.PLUGIN_GROUP)
    monkeypatch.setattr(
        "smelt_interp.plugins.entry_points", lambda group=None: [point] if group else []
    )
    model = load_looped(remote_folder, allow_remote_code=True)
    assert model.cfg.arch == "my_loop"
    sys.modules["my_loop_plugin"].ARCH = object()
    monkeypatch.setattr(adapters_load, "ARCHS", {})
    with pytest.raises(CheckpointError, match="is not an instance of Arch"):
        load_looped(remote_folder, allow_remote_code=True)
