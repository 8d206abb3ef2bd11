"""The trainer's periodic Dyck evaluation scores the validation draw: the same words for every
training seed (the first of those a recipe sweep scores), none of them in the test draw the
seeds command reports on."""

from __future__ import annotations

from smelt_interp.commands.seed_report import dyck_words
from smelt_interp.data.dyck_draws import TEST, VALIDATION, draw_words
from smelt_interp.train.build import build_config
from smelt_interp.train.data import TrainingData
from smelt_interp.train.evaluators import DyckExactMatch, DyckGreedyMatch, run_evaluators


def scored_queries(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(queries of the periodic exact match, queries of the final greedy one) of a run."""
    cfg = build_config("dyck-pair-tiny", None, overrides)
    evaluators = run_evaluators(cfg, TrainingData(cfg))
    tf = next(e for e in evaluators if isinstance(e, DyckExactMatch))
    greedy = next(e for e in evaluators if isinstance(e, DyckGreedyMatch))
    return [ex.query for ex in tf.examples], [ex.query for ex in greedy.examples]


def test_the_trainer_scores_the_validation_draw_for_every_seed():
    cfg = build_config("dyck-pair-tiny", None, ["dyck_eval_n=30"])
    spec = cfg.corpus.dyck.task_draw()
    tf, greedy = scored_queries(["dyck_eval_n=30"])
    assert tf == greedy == draw_words(VALIDATION, 30, spec)
    assert scored_queries(["dyck_eval_n=30", "seed=3"])[0] == tf  # not the training seed's
    # the seeds command's test words (apart from its own 12 validation words and the trainer's)
    reported = [ex.query for ex in dyck_words(cfg, spec, 12, TEST)]
    assert len(reported) == 12 and not set(reported) & set(tf)
    assert draw_words(VALIDATION, 12, spec) == tf[:12]  # its validation words lead the trainer's
