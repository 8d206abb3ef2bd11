"""The probes' JSON on fixed tiny checkpoints is what it was when the goldens were recorded (the
commit before the attention statistics were gathered into measure/): moving a computation
between modules must not move a number. The checkpoints are built here from fixed seeds
(random weights, no training), so a golden changes only if a probe's arithmetic does.

Record again (only for a deliberate change of a probe's output, said so in the commit):

    SMELT_RECORD_GOLDENS=1 python -m pytest tests/probes/test_probe_goldens.py
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TINY_FIELDS
from helpers.tiny_looped import tiny_folder

from smelt_interp.app.prompt_run import run_prompt
from smelt_interp.app.registry import ModelRegistry
from smelt_interp.checkpoint import save_checkpoint
from smelt_interp.config import ModelConfig
from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_rows
from smelt_interp.loading import load_model
from smelt_interp.measure.sink import sink_record
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes import registry
from smelt_interp.probes.cli import probe_main
from smelt_interp.train.case_eval import heldout_case

GOLDEN = Path(__file__).parents[1] / "data" / "probe_goldens"
RECORD = bool(os.environ.get("SMELT_RECORD_GOLDENS"))
SMALL = ("--n-seqs", "2", "--seq-len", "32", "--seed", "3")
DYCK = ("--n-seqs", "2", "--demos", "0,1", "--seed", "3", "--draw", "validation")
# The forward passes are float32: another CPU's kernels (AVX-512 against AVX2) move them by
# ~1e-7 relative, and statistics near zero or built from differences by up to ~1e-9 absolute,
# ~1e-5 relative; a changed definition moves a number by far more
ABS, REL = 1e-6, 1e-5
F32 = 1e-6  # a float32 mean against a float64 one of the same float32 values
PROMPT = ("--prompt", "Input: ( [ { < > } ] ) ( [ ] ) Output: ) ]")
FIELDS = {"max_seq_len": 256}  # room for Dyck prompts with demonstrations

# (golden name, model, probe, extra flags)
CASES = [
    ("smelt_sink", "smelt", "sink", SMALL),
    ("baseline_sink", "baseline", "sink", SMALL),
    ("smelt_routing", "smelt", "routing", SMALL),
    ("smelt_similarity", "smelt", "similarity", SMALL),
    ("smelt_residual", "smelt", "residual", SMALL),
    ("baseline_residual", "baseline", "residual", SMALL),
    ("smelt_lens", "smelt", "lens", DYCK),
    ("smelt_dla", "smelt", "dla", SMALL),
    ("smelt_case_study_dyck", "smelt", "case_study", (*DYCK, "--task", "dyck")),
    ("baseline_case_study_dyck", "baseline", "case_study", (*DYCK, "--task", "dyck")),
    (
        "smelt_case_study_recall",
        "smelt",
        "case_study",
        ("--n-seqs", "3", "--seq-len", "48", "--seed", "3", "--task", "assoc_recall"),
    ),
    ("inkling_sink", "inkling", "sink", PROMPT),
    ("inkling_similarity", "inkling", "similarity", PROMPT),
    ("inkling_case_study_dyck", "inkling", "case_study", (*DYCK, "--task", "dyck")),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Fixed tiny models: a SMELT and a Baseline ckpt.pt (seeds 0, 1) and an inkling2_loop
    folder (learned sink logits, sliding windows) with a tokenizer."""
    root = tmp_path_factory.mktemp("golden_models")
    paths = {}
    for seed, (name, looped) in enumerate((("smelt", True), ("baseline", False))):
        torch.manual_seed(seed)
        make = ModelConfig.smelt if looped else ModelConfig.baseline
        model = SmeltModel(make(**(TINY_FIELDS | FIELDS)))
        paths[name] = save_checkpoint(root / name / "ckpt.pt", model)
    paths["inkling"] = tiny_folder(root, "inkling2_loop", seed=2, tokenizer=True)
    return paths


def probe_json(model: Path, probe: str, flags: tuple[str, ...], out: Path) -> dict[str, Any]:
    """The command's JSON (summary, tables, schedule, probed tokens), without file paths."""
    spec = registry.get(probe)
    assert probe_main(spec, [str(model), *flags, "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    for described in payload["models"].values():
        described.pop("checkpoint")
    return payload


def assert_same(got: Any, want: Any, where: str = "", rel: float = REL) -> None:
    """Equal structure and strings, numbers within float64 reordering noise (or `rel`)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), (where, got, want)
        for key in want:
            assert_same(got[key], want[key], f"{where}.{key}", rel)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]", rel)
    elif isinstance(want, float) and not isinstance(want, bool):
        assert isinstance(got, int | float), (where, got, want)
        if math.isnan(want):
            assert math.isnan(got), (where, got)
        else:
            assert got == pytest.approx(want, rel=rel, abs=ABS), where
    else:
        assert got == want, (where, got, want)


@pytest.mark.parametrize("name, model, probe, flags", CASES, ids=[c[0] for c in CASES])
def test_probe_json_matches_its_golden(models, tmp_path, name, model, probe, flags):
    got = probe_json(models[model], probe, flags, tmp_path / "out.json")
    path = GOLDEN / f"{name}.json"
    if RECORD:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    assert got["tables"], "a golden with no tables compares nothing"
    assert_same(got, want, name)


def test_the_comparison_sees_a_changed_number():
    """The comparison is not blind: a mass moved by 1e-4 fails it, kernel noise does not."""
    want = {"tables": {"heads": [{"sink_mass": 0.25, "head": 0}]}}
    assert_same({"tables": {"heads": [{"sink_mass": 0.25 + 1e-7, "head": 0}]}}, want)
    with pytest.raises(AssertionError):
        assert_same({"tables": {"heads": [{"sink_mass": 0.25 + 1e-4, "head": 0}]}}, want)


def reader_numbers(models: dict[str, Path]) -> dict[str, Any]:
    """What the trainer's evaluations log and what the dashboard's prompt pages read (BOS share,
    learned-sink slot share per head), on the same fixed models."""
    smelt = load_model(models["smelt"], "cpu")[0].eval()
    spec = AssocRecallSpec()
    rows = recall_rows(4, 48, seed=5, spec=spec)
    out: dict[str, Any] = {"case_eval": heldout_case(smelt, rows, spec)}
    valid = torch.arange(48)[None, :] < torch.tensor([48, 40, 33, 48])[:, None]
    out["sink_record"] = sink_record(smelt, rows, valid, window=16)
    registry = ModelRegistry({name: models[name] for name in ("smelt", "inkling")})
    for name, prompt in (("smelt", "([{<>}])"), ("inkling", PROMPT[1])):
        run = run_prompt(registry, name, prompt)
        out[f"prompt_{name}"] = {
            f"{layer}.{visit}": {
                "bos_share": run.bos_share(layer, visit).tolist(),
                "slot_share": run.slot_share(layer, visit).tolist(),
            }
            for layer, visit in run.schedule
        }
    return out


def test_trainer_and_dashboard_numbers_match_their_golden(models):
    got = json.loads(json.dumps(reader_numbers(models)))
    path = GOLDEN / "readers.json"
    if RECORD:
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    assert got["case_eval"] and got["prompt_inkling"]
    prompts = [k for k in want if k.startswith("prompt_")]
    assert sorted(got) == sorted(want)
    for key in sorted(set(want) - set(prompts)):
        assert_same(got[key], want[key], key)
    # The prompt pages' BOS share was a float32 mean of the float32 pattern; it is the float64
    # mean of the same weights now (the learned-sink slot share always was): float32's resolution.
    for key in prompts:
        assert_same(got[key], want[key], key, rel=F32)
