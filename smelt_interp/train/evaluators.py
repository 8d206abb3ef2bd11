"""The evaluations a run makes while it trains: each an `Evaluator` (a name, a cadence in steps,
and `run(model)` giving the keys it adds to an eval record of metrics.jsonl), and
`run_evaluators`, the one place that picks them from the run's data.

Record keys (unchanged from the trainer's single evaluation): `loss/{domain}` per held-out
domain; the sink's `sink_mass/{layer}.{visit}`, `sink03_gu` and `sink03_64` on the first
domain's rows (train/sink_eval.py); the case study's `case/...` when the run trains associative
recall (train/case_eval.py); `computed_query_accuracy` and `computed_answer_accuracy` when it
trains computed-class recall; `dyck_exact_match` (teacher-forced, one batched pass, equal to greedy
decoding's) when it trains Dyck, and at a final evaluation `dyck_exact_match_greedy` by greedy
generation. The trainer runs them in this order, in eval mode under the run's autocast."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from smelt_interp.data.assoc_recall import AssocRecallSpec
from smelt_interp.data.computed_recall import ComputedRecallSpec
from smelt_interp.data.dyck import DyckExample
from smelt_interp.measure.case_accuracy import computed_accuracy
from smelt_interp.measure.dyck_score import exact_match_accuracy, teacher_forced_exact_match
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.provenance import TASK_COMPUTED, TASK_RECALL, task_of_mix
from smelt_interp.train.case_eval import CASE_ROWS, heldout_case
from smelt_interp.train.data import TrainingData
from smelt_interp.train.evaluate import heldout_dyck_examples, heldout_loss
from smelt_interp.train.sink_eval import heldout_sink

if TYPE_CHECKING:
    from smelt_interp.train.config import TrainConfig

FINAL_ONLY = 0  # the cadence of an evaluation made only at a horizon's end
# Held-out computed-recall rows scored at least: one query a row, so fewer rows would move the
# query accuracy in steps too coarse to read a curve from (64 rows: steps of 1/64)
COMPUTED_ROWS = 64


class Evaluator(Protocol):
    """One evaluation: `run` every `every` steps (FINAL_ONLY: at the final evaluations alone),
    giving the keys it adds to the eval record."""

    name: str
    every: int

    def run(self, model: SmeltModel) -> dict[str, float]: ...


def due(evaluator: Evaluator, step: int) -> bool:
    """Whether the periodic evaluation at `step` includes `evaluator`."""
    return evaluator.every != FINAL_ONLY and step % evaluator.every == 0


@dataclass
class HeldoutLoss:
    """`loss/{domain}`: next-token loss on `rows` held-out rows of every evaluated domain."""

    data: TrainingData
    rows: int
    every: int
    name: str = "loss"

    def run(self, model: SmeltModel) -> dict[str, float]:
        return {
            f"loss/{domain}": heldout_loss(model, self.data.heldout(domain, self.rows))
            for domain in self.data.eval_domains
        }


@dataclass
class SinkMass:
    """The attention sink (sink_eval.heldout_sink) on the first evaluated domain's rows."""

    data: TrainingData
    rows: int
    every: int
    name: str = "sink"

    def run(self, model: SmeltModel) -> dict[str, float]:
        return heldout_sink(model, self.data.heldout(self.data.eval_domains[0], self.rows))


@dataclass
class CaseStudy:
    """The associative-recall case study's masses and accuracies (case_eval.heldout_case)."""

    data: TrainingData
    spec: AssocRecallSpec
    every: int
    name: str = "case"

    def run(self, model: SmeltModel) -> dict[str, float]:
        return heldout_case(model, self.data.heldout(TASK_RECALL, CASE_ROWS), self.spec)


@dataclass
class ComputedRecallAccuracy:
    """`computed_query_accuracy` and `computed_answer_accuracy`: greedy accuracy at the query
    position and at every answer position of `rows` held-out computed-recall rows
    (case_accuracy.computed_accuracy); a key whose positions the rows lack is left out."""

    data: TrainingData
    spec: ComputedRecallSpec
    rows: int
    every: int
    batch_size: int
    name: str = "computed_recall"

    def run(self, model: SmeltModel) -> dict[str, float]:
        rows = self.data.heldout(TASK_COMPUTED, self.rows)
        found = computed_accuracy(model, rows, self.spec, batch_size=self.batch_size)
        return {
            f"computed_{name}_accuracy": found[f"{name}_accuracy"]
            for name in ("query", "answer")
            if found[f"n_{name}"]
        }


@dataclass
class DyckExactMatch:
    """`dyck_exact_match`: the share of the validation draw's Dyck examples completed exactly,
    teacher-forced."""

    examples: list[DyckExample]
    every: int
    name: str = "dyck_exact_match"

    def run(self, model: SmeltModel) -> dict[str, float]:
        hits = teacher_forced_exact_match(model, self.examples)
        return {"dyck_exact_match": sum(hits) / len(hits)}


@dataclass
class DyckGreedyMatch:
    """`dyck_exact_match_greedy`: the same examples decoded greedily, at final evaluations."""

    examples: list[DyckExample]
    every: int = FINAL_ONLY
    name: str = "dyck_exact_match_greedy"

    def run(self, model: SmeltModel) -> dict[str, float]:
        return {"dyck_exact_match_greedy": exact_match_accuracy(model, self.examples)}


def run_evaluators(cfg: TrainConfig, data: TrainingData) -> list[Evaluator]:
    """The evaluations of a run, from its data: held-out loss and the sink when it has
    held-out domains, the case study when it trains associative recall, computed-recall accuracy
    (on `eval.rows` held-out rows, at least COMPUTED_ROWS) when it trains computed-class recall,
    Dyck exact match when it trains Dyck (and `eval.dyck_n` > 0). All at the run's
    `eval.every`, in record order."""
    every, rows = cfg.eval.every, cfg.eval.rows
    out: list[Evaluator] = []
    if data.eval_domains:
        out += [HeldoutLoss(data, rows, every), SinkMass(data, rows, every)]
    if task_of_mix(cfg.corpus.weights) == TASK_RECALL:  # the one answer to "which task"
        out.append(CaseStudy(data, cfg.corpus.assoc_recall, every))
    if cfg.corpus.weights.get(TASK_COMPUTED, 0) > 0:
        n_rows = max(rows, COMPUTED_ROWS)
        spec = cfg.corpus.computed_recall
        out.append(ComputedRecallAccuracy(data, spec, n_rows, every, cfg.batch.size))
    examples = heldout_dyck_examples(cfg, cfg.eval.dyck_n)  # the validation draw
    if examples:
        out += [DyckExactMatch(examples, every), DyckGreedyMatch(examples)]
    return out


def evaluate_all(
    evaluators: Sequence[Evaluator], model: SmeltModel, step: int | None, final: bool
) -> dict[str, float]:
    """One eval record's keys: those of every evaluator due at `step` (every periodic one when
    `step` is None), and with `final` the final-only ones too, in the evaluators' order."""
    out: dict[str, float] = {}
    for evaluator in evaluators:
        periodic = evaluator.every != FINAL_ONLY
        if (final and not periodic) or (periodic and (step is None or due(evaluator, step))):
            out |= evaluator.run(model)
    return out
