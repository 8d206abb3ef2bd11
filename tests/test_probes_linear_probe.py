"""The linear probe as a probe (probes.linear_probe): its command on a tiny checkpoint writes one
row per visit input and one for the last output, with the control and majority columns and the
feature named, by module and through `python -m smelt_interp.probes` alike; a bad checkpoint, or
a model whose context holds no computed-recall row, is one error line and exit code 2; the class
labels are a slow loop over the rows' triples; the rows follow the spec the inputs carry."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_FIELDS
from helpers.bad_input import assert_one_line_error, run_command

from smelt_interp.checkpoint import save_checkpoint
from smelt_interp.config import ModelConfig
from smelt_interp.data.computed_recall import (
    ARROW,
    SYMBOLS,
    ComputedRecallSpec,
    computed_rows,
)
from smelt_interp.figures.probes import RENDERERS
from smelt_interp.measure.linear_probe import COLUMNS
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes import computed_inputs, linear_probe
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import ProbeOptions

FLAGS = ("--n-seqs", "4", "--seed", "2")


def tiny_ckpt(folder: Path, **fields) -> Path:
    torch.manual_seed(0)
    model = SmeltModel(ModelConfig.smelt(**(TINY_FIELDS | fields)))
    return save_checkpoint(folder / "ckpt.pt", model, step=0)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_ckpt(tmp_path_factory.mktemp("linear_probe"))


def test_the_command_writes_a_row_per_visit_and_the_last_output(ckpt: Path, tmp_path: Path):
    tables = {}
    for label, command in (
        ("module", ("smelt_interp.probes.linear_probe", ckpt)),
        ("name", ("smelt_interp.probes", "linear_probe", ckpt)),
    ):
        out = tmp_path / f"{label}.json"
        code, stdout, err = run_command(*command, *FLAGS, "--json", out)
        assert code == 0, err
        assert "== linear_probe: smelt ==" in stdout and "class accuracy, last output" in stdout
        payload = json.loads(out.read_text())
        tables[label] = payload["tables"]["probes"]
    assert tables["module"] == tables["name"]
    rows = tables["module"]
    schedule = ModelConfig.smelt(**TINY_FIELDS).schedule
    assert [(r["layer"], r["visit"], r["hook"]) for r in rows] == [
        *((layer, visit, "resid_pre") for layer, visit in schedule),
        (*schedule[-1], "resid_post"),
    ]
    assert [r["depth"] for r in rows] == list(range(len(schedule) + 1))
    assert set(rows[0]) == {"model", "feature", *COLUMNS}
    for r in rows:
        assert r["feature"] == "class" and r["n_labels"] == 4
        assert 0 <= r["control"] <= 1 and 0 <= r["majority"] <= 1
        assert r["n_train"] > 0 and r["n_test"] > 0
    statistics = [s["statistic"] for s in payload["summary"]]
    assert statistics == [
        "class accuracy, input of layer 1 visit 0",
        "class control, input of layer 1 visit 0",
        "class accuracy, input of layer 1 visit 1",
        "class control, input of layer 1 visit 1",
        "class accuracy, last output",
        "class control, last output",
        "class majority level",
    ]


def test_its_spec_is_complete_as_a_built_in_ones_must_be():
    """What tests/probes/test_probe_registry.py asks of every built-in probe, so registering
    it is a matter of naming it (in registry.BUILTIN and on the dashboard)."""
    spec = linear_probe.PROBE
    assert spec.name == "linear_probe" and spec.description and spec.tables == ("probes",)
    [figure] = spec.figures
    assert (figure.kind, figure.table, figure.y) == ("by_depth", "probes", "accuracy")
    assert figure.kind in RENDERERS


def test_a_bad_checkpoint_is_one_line(tmp_path: Path, ckpt: Path):
    bad = tmp_path / "corrupt.pt"
    bad.write_bytes(ckpt.read_bytes()[:200])
    code, _, err = run_command("smelt_interp.probes.linear_probe", bad, *FLAGS)
    assert_one_line_error(code, err, "corrupt.pt")
    short = tiny_ckpt(tmp_path / "short", max_seq_len=8)
    code, _, err = run_command("smelt_interp.probes.linear_probe", short, *FLAGS)
    assert_one_line_error(code, err, "context is too short for computed recall")


def slow_classes(rows: torch.Tensor, spec: ComputedRecallSpec) -> tuple[list, list]:
    """The `=` positions with three symbols before them, and their triples' classes, row by row."""
    index = {s: i for i, s in enumerate(SYMBOLS[: spec.n_symbols])}
    where, labels = [], []
    for r, row in enumerate(rows.tolist()):
        for t, token in enumerate(row):
            if token == ARROW and t >= 3 and all(s in index for s in row[t - 3 : t]):
                where.append((r, t))
                labels.append(spec.class_of(*(index[s] for s in row[t - 3 : t])))
    return where, labels


@pytest.mark.parametrize("key", ["deep", "shallow"])
def test_the_class_labels_are_the_triples_classes(key: str):
    spec = ComputedRecallSpec(key=key, table_seed=3)
    rows = computed_rows(6, 66, "probe-fit:0", split="heldout", spec=spec)
    where, labels = linear_probe.class_feature(rows, spec)
    want_where, want_labels = slow_classes(rows, spec)
    assert [tuple(p) for p in torch.nonzero(where).tolist()] == want_where
    assert labels.tolist() == want_labels and labels.dtype == np.int64
    assert len(want_where) == 6 * 11  # every demonstration's `=` and the query's


def test_the_rows_follow_the_spec_and_namespaces_the_inputs_carry(monkeypatch):
    """Fit and scored rows come from the two namespaces, under the spec and row length the
    inputs carry (the checkpoint's, where probes.session passes them on)."""
    spec = ComputedRecallSpec(key="shallow", n_classes=3, table_seed=5)
    drawn = []

    def spy(n_rows, length, seed, *, split, spec):
        drawn.append((n_rows, length, seed, split, spec))
        return computed_rows(n_rows, length, seed, split=split, spec=spec)

    monkeypatch.setattr(computed_inputs, "computed_rows", spy)
    torch.manual_seed(0)
    model = SmeltModel(ModelConfig.smelt(**TINY_FIELDS)).eval()
    inputs = ProbeInputs(n_seqs=3, seed=4)
    inputs.computed_recall, inputs.computed_row_len = spec, 36
    table = linear_probe.run(model, inputs, ProbeOptions())["probes"]
    assert drawn == [
        (3, 36, "probe-fit:4", "heldout", spec),
        (3, 36, "probe-score:4", "heldout", spec),
    ]
    assert (table["n_labels"] <= 3).all() and (table["n_train"] == 3 * 6).all()


def test_a_checkpoint_trained_on_computed_recall_is_probed_under_its_own_spec(tmp_path: Path):
    """Its spec (three classes, the shallow key) and row length (36: five demonstrations and
    the query) reach the rows through probes.session.make_inputs."""
    torch.manual_seed(0)
    model = SmeltModel(ModelConfig.smelt(**TINY_FIELDS))
    trained = {
        "data": {"computed_recall": 1.0},
        "computed_recall": {"key": "shallow", "n_classes": 3},
        "seq_len": 36,
    }
    path = save_checkpoint(tmp_path / "ckpt.pt", model, step=0, train_config=trained)
    out = tmp_path / "out.json"
    code, _, err = run_command("smelt_interp.probes.linear_probe", path, *FLAGS, "--json", out)
    assert code == 0, err
    rows = json.loads(out.read_text())["tables"]["probes"]
    assert all(r["n_labels"] == 3 and r["n_train"] == 4 * 6 for r in rows)


def test_an_adapted_model_is_probed_at_each_of_its_visits():
    """A transformers looped model (tests/helpers/tiny_looped.py's Dory, its vocabulary grown
    to hold the byte rows) gives hook_resid_pre per visit, so the probe reads it as it reads a
    SmeltModel."""
    from helpers.tiny_looped import make_config, tiny_model

    from smelt_interp.adapters import adapt

    config = make_config("dory")
    config.vocab_size = 260
    model = adapt(tiny_model("dory", config=config))
    spec = ComputedRecallSpec()
    fit, score = (
        computed_rows(4, 60, f"{name}:0", split="heldout", spec=spec)
        for name in ("probe-fit", "probe-score")
    )
    table = linear_probe.feature_table(model, fit, score, spec)
    assert [(r.layer, r.visit) for r in table.itertuples()] == [
        *model.schedule,
        model.schedule[-1],
    ]
    assert (table["n_train"] == 4 * 10).all() and (table["n_labels"] == 4).all()
