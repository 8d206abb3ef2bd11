"""Sink^0.3 as Gu et al. compute it, against a direct transcription of their evaluation's
`compute_attention_sink` (sail-sg/Attention-Sink, eval_sink_open_source.py): importance of key j
= sum_i A[i, j] / (T - j), thresholded per sample, averaged over samples, layers and heads; the
first key's entry is Sink^0.3. Hand-built patterns where the pooled figure and the per-sample one
differ, then the sink probe, the trainer's record and the case study on a random tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smelt_interp import hook_name
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.measure.sink import sink03_table, sink_record
from smelt_interp.measure.sink_gu import (
    GU_KEY,
    GU_NAME,
    POOLED_NAME,
    gu_sink03,
    importance_from_pattern,
)
from smelt_interp.probes import sink

T = 64


def gu_transcription(scores: np.ndarray, epsilon: float = 0.3) -> float:
    """Their formula, written again: scores [samples, layers, heads, T, T]; the share for key 0."""
    n_tokens = scores.shape[-1]
    ratios = np.arange(n_tokens, 0, -1, dtype=np.float64)[None, None, None, None, :]
    importance = (scores / ratios).sum(axis=-2)  # [samples, layers, heads, T]
    return float((importance > epsilon).astype(np.float64).mean(axis=(0, 1, 2))[0])


def causal_pattern(bos: float) -> np.ndarray:
    """[T, T]: query 0 on key 0; every later query puts `bos` on key 0, the rest evenly on 1..i."""
    p = np.zeros((T, T))
    p[0, 0] = 1.0
    for i in range(1, T):
        p[i, 0] = bos
        p[i, 1 : i + 1] = (1 - bos) / i
    return p


def pooled_share(scores: np.ndarray, epsilon: float = 0.3) -> float:
    """The figure the workbench reported before: queries 1..T-1 pooled over samples, per (layer,
    head), thresholded once."""
    mass = scores[..., 1:, 0].mean(axis=(0, 3))  # [layers, heads]
    return float((mass > epsilon).mean())


def test_gu_differs_from_the_pooled_figure_and_matches_the_transcription():
    # 4 samples, 2 layers, 2 heads; head (0, 0) sinks hard in half the samples and not at all in
    # the rest (pooled 0.475: over 0.3 once pooled, in 2 of 4 samples per sample); head (0, 1)
    # sits at 0.33 in every sample but one, where it is 0.0 (pooled 0.25 < 0.3, per sample 3/4);
    # layer 1 never sinks
    bos = np.zeros((4, 2, 2))
    bos[:, 0, 0] = [0.9, 0.9, 0.05, 0.05]
    bos[:, 0, 1] = [0.33, 0.33, 0.33, 0.0]
    bos[:, 1, :] = 0.1
    scores = np.stack(
        [np.stack([np.stack([causal_pattern(b) for b in layer]) for layer in s]) for s in bos]
    )
    expected = gu_transcription(scores)
    # per sample: head (0, 0) 2 of 4, head (0, 1) 3 of 4 (0.33 + query 0's 1/64 > 0.3), over
    # 4 (layer, head)s
    assert expected == pytest.approx((2 / 4 + 3 / 4) / 4)
    assert pooled_share(scores) == pytest.approx(1 / 4)  # only head (0, 0)
    valid = torch.ones(4, T, dtype=torch.bool)
    importances = [importance_from_pattern(torch.from_numpy(scores[:, i]), valid) for i in (0, 1)]
    assert gu_sink03(importances) == pytest.approx(expected, abs=1e-12)
    # the importance itself is their key-0 score, query 0 included
    ref = scores[:, 0, :, :, 0].sum(axis=-1) / T
    assert importances[0].numpy() == pytest.approx(ref, abs=1e-12)


def test_query_zero_is_kept():
    """A head with 0.29 on key 0 at every query i >= 1 passes 0.3 only because query 0's own
    attention (1.0) counts, as in Gu et al.'s script: (1 + 63 * 0.299) / 64 = 0.310."""
    scores = causal_pattern(0.299)[None, None, None]
    assert gu_transcription(scores) == 1.0
    valid = torch.ones(1, T, dtype=torch.bool)
    imp = importance_from_pattern(torch.from_numpy(scores[:, 0]), valid)
    assert float(imp) == pytest.approx((1 + 63 * 0.299) / 64)
    assert gu_sink03([imp]) == 1.0
    assert pooled_share(scores) == 0.0


LENGTHS = [100, 70, 80, 66]  # every row at least T long, as Gu et al. require


@pytest.fixture
def model(make_cfg, make_model):
    return make_model(make_cfg(init_std=0.5, max_seq_len=128), seed=4)


@pytest.fixture
def padded(make_tokens):
    tokens = make_tokens(len(LENGTHS), max(LENGTHS), seed=5)
    for r, n in enumerate(LENGTHS):
        tokens[r, n:] = PAD_ID
    return tokens, torch.tensor(LENGTHS)


def model_scores(model, tokens) -> np.ndarray:
    """[samples, visits, heads, T, T] from hook_pattern, each row cut to its first T tokens."""
    names = set(model.hook_names("attn.hook_pattern"))
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    per_visit = [
        cache[hook_name(layer, visit, "attn.hook_pattern")].double()[:, :, :T, :T].numpy()
        for layer, visit in model.schedule
    ]
    return np.stack(per_visit, axis=1)


def test_probe_trainer_and_case_study_give_gu_value(model, padded):
    tokens, lengths = padded
    scores = model_scores(model, tokens)
    importance = scores[..., 0].sum(axis=-1) / T  # [samples, visits, heads]
    # a random model has no head over 0.3: threshold at the median importance, where the share
    # per sample differs from the pooled one
    cut = float(np.median(importance))
    expected = gu_transcription(scores, cut)
    assert 0 < expected < 1
    heads = sink.measure(model, tokens, lengths, batch_size=3, chunk=16, threshold=cut)
    tables = {"heads": heads, "visits": sink.by_visit(heads)}
    summ = sink.summarize(tables).set_index("statistic")["value"]
    assert summ[GU_NAME] == pytest.approx(expected, abs=1e-9)
    assert POOLED_NAME in summ.index
    # the visits table: per (layer, visit), the share of heads over the cut per sample, averaged
    visits = tables["visits"].set_index(["layer", "visit"])
    for v, (layer, visit) in enumerate(model.schedule):
        row = visits.loc[(layer, visit)]
        assert row[GU_KEY] == pytest.approx((importance[:, v] > cut).mean(), abs=1e-9)
    record = sink_record(model, tokens, tokens != PAD_ID, threshold=cut)
    assert record[GU_KEY] == pytest.approx(expected, abs=1e-9)
    # at Gu et al.'s own threshold the three paths agree with the transcription too
    at_03 = gu_transcription(scores)
    assert sink_record(model, tokens, tokens != PAD_ID)[GU_KEY] == pytest.approx(at_03)
    table = sink03_table(model, tokens, tokens != PAD_ID).iloc[0]
    assert table[GU_KEY] == pytest.approx(at_03)
    assert table[f"{GU_KEY}_lo"] <= table[GU_KEY] <= table[f"{GU_KEY}_hi"]


def test_one_prompt_is_one_sample(model, padded):
    """--prompt-ids gives one row: Gu's value is that row's share of (visit, head)s."""
    tokens, lengths = padded
    one = tokens[:1, : LENGTHS[0]]
    scores = model_scores(model, one)
    cut = float(np.median(scores[..., 0].sum(axis=-1) / T))
    heads = sink.measure(model, one, lengths[:1], threshold=cut)
    summ = sink.summarize({"heads": heads, "visits": sink.by_visit(heads)}).set_index("statistic")
    assert summ.loc[GU_NAME, "value"] == pytest.approx(gu_transcription(scores, cut), abs=1e-9)
