"""The real pretrained model (SmolLM2-135M-Instruct, prepared by `make real-lm` into
models/smollm2-135m; `make test` prepares it first): the sink probe's per-head first-token mass
on a fixed 64-token row of text, through its command line, against transformers' own eager
output_attentions of the same folder, and the folder as the preparation describes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from smelt_interp.adapters.real_lm import FOLDER, MANIFEST, manifest_problem

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / FOLDER
TEXT = (
    "The river rose slowly through the night, and by morning the low fields beside the mill "
    "were under water. The miller walked out along the dyke to look at the damage, counting the "
    "fence posts that still showed above the flood, and wondering how long it would take for "
    "the ground to dry before the spring planting could begin again."
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        manifest_problem(MODEL) is not None,
        reason=f"the real model is not prepared ({manifest_problem(MODEL)}): make real-lm",
    ),
]


@pytest.fixture(scope="module")
def row() -> list[int]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(MODEL)(TEXT)["input_ids"]
    assert len(ids) >= 64
    return ids[:64]


def test_the_folder_is_what_the_preparation_says(row: list[int]) -> None:
    config = json.loads((MODEL / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"]) == (30, 576)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    readme = (MODEL / "README.md").read_text()
    assert "Apache-2.0" in readme and "Q4_1" in readme and "instruct" in readme
    assert set(json.loads((MODEL / MANIFEST).read_text())["files"]) >= {"model.safetensors"}
    assert row[0] == 504  # "The": this tokenizer adds no BOS, the text's first token leads


def test_sink_probe_first_token_mass_equals_transformers_eager(
    row: list[int], tmp_path: Path
) -> None:
    import transformers

    out = tmp_path / "sink.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    ids = ",".join(map(str, row))
    done = subprocess.run(
        [sys.executable, "-m", "smelt_interp.probes.sink", str(MODEL), "--prompt-ids", ids,
         "--device", "cpu", "--json", str(out)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    heads = json.loads(out.read_text())["tables"]["heads"]
    got = torch.tensor([[h["sink_mass"] for h in heads if h["layer"] == n] for n in range(30)])
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        MODEL, attn_implementation="eager", dtype=torch.float32
    ).eval()
    with torch.no_grad():
        attentions = hf(torch.tensor([row]), output_attentions=True).attentions
    want = torch.stack([a[0, :, 1:, 0].double().mean(-1) for a in attentions])  # [30, 9]
    assert got.shape == want.shape == (30, 9)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    assert want.mean() > 0.3  # a real sink: far above uniform attention on 64 tokens (~0.07)
