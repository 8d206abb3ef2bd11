"""The trainer on computed-class recall (data.computed_recall): the `computed_recall` spec in the
config and the checkpoint's record, the training and held-out rows, the accuracy at the query
and answer positions (measure.case_accuracy.computed_accuracy) against plain loops, and a
seconds-long run of the computed-recall-tiny preset recording that accuracy."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.data.computed_recall import (
    ARROW,
    LABELS,
    SYMBOLS,
    ComputedRecallSpec,
    computed_rows,
)
from smelt_interp.data.tokenizer import BOS_ID, PAD_ID
from smelt_interp.errors import ConfigError
from smelt_interp.measure.case_accuracy import computed_accuracy
from smelt_interp.model.protocol import VisitNaming
from smelt_interp.provenance import Provenance
from smelt_interp.train.build import build_config
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.data import TrainingData
from smelt_interp.train.evaluators import COMPUTED_ROWS, ComputedRecallAccuracy, run_evaluators
from smelt_interp.train.metrics import main_evals, read_metrics
from smelt_interp.train.presets import get_preset
from smelt_interp.train.trainer import Trainer, pair_configs

PRESET = "computed-recall-tiny"
SPEC = ComputedRecallSpec(key="shallow", table_seed=3, n_classes=5)
SETS = [
    "computed_recall.key=shallow",
    "computed_recall.table_seed=3",
    "computed_recall.n_classes=5",
]
VOCAB = 259


# ----- the config and the checkpoint's record ------------------------------------------------
def test_the_spec_parses_from_a_preset_mapping_and_from_set() -> None:
    preset = TrainConfig.from_dict(
        {
            **get_preset(PRESET),
            "computed_recall": {"key": "shallow", "table_seed": 3, "n_classes": 5},
        }
    )
    assert preset.corpus.computed_recall == SPEC
    assert build_config(PRESET, None, SETS).corpus.computed_recall == SPEC
    assert build_config(PRESET, None, []).corpus.computed_recall == ComputedRecallSpec()
    sectioned = TrainConfig.from_dict({"corpus": {"computed_recall": {"key": "shallow"}}})
    assert sectioned.corpus.computed_recall.key == "shallow"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"key": "middle"}, "key must be one of deep, shallow"),
        ({"n_classes": 99}, "n_classes must be an integer in 2..26"),
        ({"n_symbols": 3, "n_classes": 4}, "n_classes (4) must be at most n_symbols (3)"),
        ({"depth": 2}, "unknown computed_recall field(s) 'depth'"),
        ("deep", "computed_recall must be a mapping"),
    ],
)
def test_a_bad_spec_is_one_line(spec: object, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({**get_preset(PRESET), "computed_recall": spec})
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert "computed_recall" in str(info.value)


def test_a_bad_set_is_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        build_config(PRESET, None, ["computed_recall.n_classes=1"])
    message = str(info.value)
    assert message.startswith("computed_recall: n_classes") and "\n" not in message


def test_the_record_holds_the_spec_when_the_run_trains_it_or_changes_it() -> None:
    record = build_config(PRESET, None, SETS).to_dict()
    assert (
        ComputedRecallSpec.from_mapping(json.loads(json.dumps(record))["computed_recall"]) == SPEC
    )
    trained = build_config(PRESET, None, []).to_dict()
    assert trained["computed_recall"] == dataclasses.asdict(ComputedRecallSpec())
    # a run that neither trains it nor changes it writes the record it wrote before
    dyck = TrainConfig.from_dict(get_preset("dyck-pair-tiny"))
    assert "computed_recall" not in dyck.to_dict()
    changed = dyck.with_overrides({"computed_recall.key": "shallow"}).to_dict()
    assert changed["computed_recall"]["key"] == "shallow"
    for cfg in (dyck, build_config(PRESET, None, SETS)):
        assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


# ----- the rows ---------------------------------------------------------------------------------
def test_training_rows_are_the_generator_rows_and_held_out_rows_are_others() -> None:
    cfg = build_config(PRESET, None, [*SETS, "seed=7"])
    data = TrainingData(cfg)
    length, size = cfg.batch.seq_len, cfg.batch.size
    for step in (0, 5):
        want = computed_rows(size, length, seed=f"7:0:{step}:computed_recall0", spec=SPEC)
        assert torch.equal(data.batch_at(step), want)
    heldout = data.heldout("computed_recall", 64)
    assert torch.equal(heldout, computed_rows(64, length, seed=7, split="heldout", spec=SPEC))
    assert data.eval_domains == ["computed_recall"]
    trained = {tuple(row.tolist()) for step in range(30) for row in data.batch_at(step)}
    assert len(trained) == 30 * size
    assert trained.isdisjoint(tuple(row.tolist()) for row in heldout)
    # the default spec's rows are other rows: the spec is what the data draws with
    other = TrainingData(build_config(PRESET, None, ["seed=7"]))
    assert not torch.equal(other.batch_at(0), data.batch_at(0))


def test_a_row_len_sets_the_domains_row_length() -> None:
    cfg = build_config(PRESET, None, [*SETS, "row_len.computed_recall=78", "batch_size=4"])
    data = TrainingData(cfg)
    [part] = data.batch_parts(0)
    assert part.shape[1] == 78
    heldout = data.heldout("computed_recall", 8)
    assert torch.equal(heldout, computed_rows(8, 78, seed=cfg.seed, split="heldout", spec=SPEC))


# ----- the accuracy against plain loops ---------------------------------------------------------
class Fixed(VisitNaming, nn.Module):
    """A stand-in model: logits with all mass on the next token of its input row (`label`
    None: a perfect next-token predictor) or on the constant `label`."""

    def __init__(self, label: int | None) -> None:
        super().__init__()
        self.cfg = SimpleNamespace(vocab_size=VOCAB, max_seq_len=128, first_token_id=BOS_ID)
        self.label = label
        self.anchor = nn.Parameter(torch.zeros(()))  # where the model lives

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.label is None:
            next_tokens = torch.cat([tokens[:, 1:], tokens[:, -1:]], dim=1)
        else:
            next_tokens = torch.full_like(tokens, self.label)
        return nn.functional.one_hot(next_tokens, VOCAB).float() * 10.0


def plain_accuracy(rows: torch.Tensor, spec: ComputedRecallSpec, label: int) -> tuple[float, float]:
    """(query, answer) accuracy of always predicting `label`, by loops over the tokens: an answer
    position holds `=` with a target and an earlier `=` of the same class; the query is the
    row's last `=`."""
    query_hits, answer_hits, n_answer = 0, 0, 0
    for row in rows.tolist():
        seen: set[int] = set()
        last = None
        for q, token in enumerate(row):
            if token != ARROW:
                continue
            x, y, z = (SYMBOLS.index(t) for t in row[q - 3 : q])
            c = spec.class_of(x, y, z)
            if c in seen and q + 1 < len(row) and row[q + 1] != PAD_ID:
                n_answer += 1
                answer_hits += row[q + 1] == label
            seen.add(c)
            last = q
        assert last is not None
        query_hits += row[last + 1] == label
    return query_hits / len(rows), answer_hits / n_answer


@pytest.mark.parametrize("spec", [ComputedRecallSpec(), SPEC])
def test_computed_accuracy_against_a_plain_loop(spec: ComputedRecallSpec) -> None:
    rows = computed_rows(13, 70, seed=2, split="heldout", spec=spec)  # 10 demos, then PAD
    assert (rows[:, -1] == PAD_ID).all()
    perfect = computed_accuracy(Fixed(None), rows, spec, batch_size=4)
    assert perfect["query_accuracy"] == perfect["answer_accuracy"] == 1.0
    assert perfect["n_query"] == 13 and perfect["n_answer"] >= 13
    for label in (LABELS[0], LABELS[1], ARROW):
        found = computed_accuracy(Fixed(label), rows, spec, batch_size=5)
        query, answer = plain_accuracy(rows, spec, label)
        assert (found["query_accuracy"], found["answer_accuracy"]) == pytest.approx(
            (query, answer), abs=1e-12
        )
    # every query's answer is one of the spec's labels, so the constant labels' shares add to 1
    shares = [
        computed_accuracy(Fixed(label), rows, spec)["query_accuracy"] for label in spec.label_ids
    ]
    assert sum(shares) == pytest.approx(1.0) and max(shares) < 1.0


def test_computed_accuracy_by_hand() -> None:
    """Two hand-made rows under the shallow key (class = h(x)): in the first the query repeats
    the first demonstration's triple, so its class is shown; the second's two demonstrations."""
    spec = ComputedRecallSpec(key="shallow")
    a, b = SYMBOLS[0], SYMBOLS[1]
    A, B = LABELS[0], LABELS[1]
    row1 = [BOS_ID, a, a, a, ARROW, A, ord(";"), a, a, a, ARROW, A]
    row2 = [BOS_ID, b, b, b, ARROW, B, ord(";"), b, a, a, ARROW, B]
    rows = torch.tensor([row1, row2])
    found = computed_accuracy(Fixed(A), rows, spec)
    # queries at 10 in both rows (both answer positions; the `=` at 4 is a first occurrence)
    assert found == {"query_accuracy": 0.5, "n_query": 2, "answer_accuracy": 0.5, "n_answer": 2}
    assert computed_accuracy(Fixed(B), rows, spec)["query_accuracy"] == 0.5
    missing = computed_accuracy(Fixed(A), torch.tensor([row1[:6]]), spec)
    assert missing["n_answer"] == 0 and math.isnan(missing["answer_accuracy"])


# ----- a training run ---------------------------------------------------------------------------
def test_the_evaluator_runs_only_when_the_mix_trains_computed_recall() -> None:
    cfg = build_config(PRESET, None, SETS)
    [evaluator] = [e for e in run_evaluators(cfg, TrainingData(cfg)) if e.name == "computed_recall"]
    assert isinstance(evaluator, ComputedRecallAccuracy)
    assert evaluator.rows == max(cfg.eval.rows, COMPUTED_ROWS) and evaluator.spec == SPEC
    assert evaluator.every == cfg.eval.every
    more = cfg.with_overrides({"eval_rows": 100})
    assert run_evaluators(more, TrainingData(more))[-1].rows == 100
    mixed = cfg.with_overrides({"data.computed_recall": 0.0, "data.trigger": 1.0})
    assert all(e.name != "computed_recall" for e in run_evaluators(mixed, TrainingData(mixed)))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SMELT model of computed-recall-tiny under SPEC, 4 steps, evaluated at 2 and 4."""
    sets = [*SETS, "steps=4", "warmup_steps=1", "eval_every=2", "ckpt_every=4"]
    cfg = pair_configs(build_config(PRESET, None, sets))["smelt"]
    out = tmp_path_factory.mktemp("computed") / "smelt"
    Trainer(cfg, out, progress=False).run()
    return out


def test_a_tiny_run_records_the_accuracy_of_its_checkpoint(tiny_run: Path) -> None:
    evals = list(main_evals(read_metrics(tiny_run / "metrics.jsonl")))
    assert [r["step"] for r in evals] == [2, 4]
    for record in evals:
        for key in ("computed_query_accuracy", "computed_answer_accuracy"):
            assert 0.0 <= record[key] <= 1.0, record
        assert "loss/computed_recall" in record
    # the last record is the checkpoint's accuracy on the run's held-out rows, rebuilt from its
    # record alone
    model, info = load_checkpoint(tiny_run / "ckpt.pt")
    config = info.train_config
    spec = Provenance(tiny_run / "ckpt.pt", config).computed_spec
    rows = computed_rows(
        COMPUTED_ROWS, config["seq_len"], config["seed"], split="heldout", spec=spec
    )
    again = computed_accuracy(model.eval(), rows, spec)
    last = evals[-1]
    assert last["computed_query_accuracy"] == pytest.approx(again["query_accuracy"], abs=1e-6)
    assert last["computed_answer_accuracy"] == pytest.approx(again["answer_accuracy"], abs=1e-6)


def test_the_checkpoint_record_round_trips_into_provenance(tiny_run: Path) -> None:
    _, info = load_checkpoint(tiny_run / "ckpt.pt")
    assert Provenance(tiny_run / "ckpt.pt", info.train_config).computed_spec == SPEC
    assert Provenance.of(info).computed_spec == SPEC
    assert TrainConfig.from_dict(info.train_config).corpus.computed_recall == SPEC
