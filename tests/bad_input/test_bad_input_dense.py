"""Bad input around dense model folders and inference loops, through the probe command's own
runner, as a user types it: a truncated safetensors file, an architecture the adapter does not
cover, a loop on a model that loops already, a malformed or impossible span, and --prompt-ids
outside the vocabulary are each one `error:` line with exit code 2, and the --json output is
not written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from helpers.tiny_looped import tiny_folder  # noqa: E402

from smelt_interp.cli import run_cli  # noqa: E402
from smelt_interp.probes import registry  # noqa: E402
from smelt_interp.probes.cli import probe_main  # noqa: E402


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dense-bad")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    llama = root / "llama"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(llama)
    cut = root / "cut"
    cut.mkdir()
    (cut / "config.json").write_bytes((llama / "config.json").read_bytes())
    weights = (llama / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    foreign = root / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    return {"llama": llama, "cut": cut, "foreign": foreign, "hrm": tiny_folder(root, "hrm_text")}


CASES = {
    "truncated safetensors": ("cut", [], "cannot load the model"),
    "uncovered architecture": ("foreign", [], "unknown architecture 'gpt2'"),
    "loop on a looped model": ("hrm", ["--loop", "0:2"], "loops already by its own config"),
    "malformed span": ("llama", ["--loop", "2-3"], "expected START:END"),
    "span past the layers": ("llama", ["--loop", "2:9"], "past the model's 4 layers"),
    "one repeat": ("llama", ["--loop", "1:3x1"], "at least twice"),
    "ids outside the vocabulary": ("llama", ["--prompt-ids", "1,64"], "0..63"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_line_exit_2_nothing_written(
    case: str, folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name, flags, words = CASES[case]
    out = tmp_path / "out.json"
    args = flags if "--prompt-ids" in flags else [*flags, "--prompt-ids", "1,2,3"]
    argv = [str(folders[name]), *args, "--device", "cpu", "--json", str(out)]
    with pytest.raises(SystemExit) as done:  # the command's own runner, in this process
        run_cli(lambda a: probe_main(registry.get("sink"), a), argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and words in lines[0], lines[0]
    assert not out.exists()
