"""The patching probe and its command (probes.patching, commands.patching): tables of the
model's task pair, the user's own pair, path patching, and bad input as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import TINY_FIELDS
from helpers.bad_input import assert_one_line_error, run_command

from smelt_interp.checkpoint import save_checkpoint
from smelt_interp.config import ModelConfig
from smelt_interp.figures.probes import probe_figures
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import ProbeOptions, get

COMMAND = "smelt_interp.probes.patching"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = SmeltModel(ModelConfig.smelt(**TINY_FIELDS))
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt.pt", model, step=0)


def test_the_registered_probe_patches_every_head_of_every_visit(tiny_model) -> None:
    spec = get("patching")
    tables = spec.run(tiny_model, ProbeInputs(n_seqs=2, max_seq_len=64), ProbeOptions())
    heads = tables["heads"]
    assert len(heads) == len(tiny_model.schedule) * tiny_model.cfg.n_heads
    assert {"activation", "attribution", "depth"} <= set(heads.columns)
    assert set(tables["visits"]["site"]) == {"resid_pre", "attn_out", "mlp_out", "resid_post"}
    # patching the whole residual stream before the first visit restores the clean run
    first = tables["visits"].query("site == 'resid_pre' and depth == 0")
    assert first["activation"].iloc[0] == pytest.approx(1.0, abs=1e-6)
    cross = tables["cross_visit"]
    assert set(zip(cross["visit"], cross["source_visit"])) == {(0, 1), (1, 0)}
    text = spec.summarize(tables).to_string()
    assert "Pearson" in text and "cross-visit" in text
    assert len(probe_figures(spec, {"smelt": tables})) == 1


def test_the_command_prints_the_top_nodes_and_writes_json_and_csv(ckpt, tmp_path) -> None:
    out, csv = tmp_path / "p.json", tmp_path / "p.csv"
    code, text, err = run_command(
        COMMAND, ckpt, "--n-rows", "2", "--sender", "0.0.1", "--sender", "1.0.2",
        "--receiver", "1.1.0.k", "--json", out, "--csv", csv,
    )  # fmt: skip
    assert code == 0, err
    assert "pair: dyck: changed bracket" in text and "top 10 nodes" in text
    tables = json.loads(out.read_text())
    assert set(tables) == {"nodes", "cross_visit", "path"}
    assert len(tables["path"]) == 2 and tables["path"][0]["receiver"] == "1.1 k h0"
    assert csv.exists() and (tmp_path / "p.cross_visit.csv").exists()


def test_a_users_pair_of_ids_with_answers(ckpt, tmp_path) -> None:
    out = tmp_path / "u.json"
    code, _, err = run_command(
        COMMAND, ckpt, "--clean-ids", "257,40,41,40", "--corrupt-ids", "257,91,41,40",
        "--answers", "41,93", "--site", "resid_pre", "--per-position", "--json", out,
    )  # fmt: skip
    assert code == 0, err
    nodes = json.loads(out.read_text())["nodes"]
    assert {r["position"] for r in nodes} == {0, 1, 2, 3}
    # position 1 (the changed token) at the first visit carries everything; position 0 nothing
    first = {r["position"]: r["activation"] for r in nodes if r["depth"] == 0}
    assert first[1] == pytest.approx(1.0, abs=1e-6) and first[0] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(
    "args,needles",
    [
        (("--clean", "( [", "--corrupt", "( [ ["), ("equal lengths", "got 4 and 6")),
        (("--clean-ids", "257,1,2", "--corrupt-ids", "257,1"), ("equal lengths",)),
        (("--clean-ids", "257,1,2", "--corrupt-ids", "257,1,999"), ("token ids",)),
        (("--clean", "(", "--clean-ids", "257,1"), ("not both",)),
        (("--sender", "2.1.0", "--receiver", "1.1.0.q"), ("does not run before",)),
        (("--sender", "0.0.9", "--receiver", "1.1.0.q"), ("head 9",)),
    ],
)
def test_bad_pairs_and_nodes_are_one_line_and_write_nothing(ckpt, tmp_path, args, needles):
    out = tmp_path / "never.json"
    code, _, err = run_command(COMMAND, ckpt, *args, "--json", out)
    assert_one_line_error(code, err, *needles)
    assert not out.exists()


def test_a_model_that_reads_no_task_text_gets_a_row_of_ids() -> None:
    pytest.importorskip("transformers")
    from helpers.tiny_looped import VOCAB, tiny_model

    from smelt_interp.adapters import adapt
    from smelt_interp.checkpoint import CheckpointInfo
    from smelt_interp.measure.patch_tables import side_by_side
    from smelt_interp.probes.patching import PairRequest, request_pair

    model = adapt(tiny_model("dory")).eval()
    info = CheckpointInfo(Path("dory"))
    pair = request_pair(model, info, PairRequest())
    assert pair.label == "ids: one id changed" and int(pair.clean.max()) < VOCAB
    assert int((pair.clean != pair.corrupt).sum()) == 1
    heads = side_by_side(model, pair, "z", per_head=True)
    assert len(heads) == len(model.schedule) * model.cfg.n_heads
    with pytest.raises(Exception, match="token ids"):
        request_pair(model, info, PairRequest(kind="dyck"))
