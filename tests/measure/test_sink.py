"""The sink probe's new columns and the trainer's sink record, each against a brute-force float64
computation from `hook_pattern` and `hook_v` on a random tiny model (rows longer and shorter than
the 64-token window, right-padded)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from smelt_interp import hook_name
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.measure.sink import WINDOW, sink_record
from smelt_interp.measure.sink_gu import POOLED_NAME
from smelt_interp.probes import sink

LENGTHS = [100, 70, 40, 2]
TOL = 1e-6


@pytest.fixture
def model(make_cfg, make_model):
    """SMELT (layers 1..2 looped), 4 query heads on 2 kv heads, patterns far from uniform."""
    return make_model(make_cfg(init_std=0.5, max_seq_len=128), seed=4)


@pytest.fixture
def padded(make_tokens):
    tokens = make_tokens(len(LENGTHS), max(LENGTHS), seed=5)
    for r, n in enumerate(LENGTHS):
        tokens[r, n:] = PAD_ID
    return tokens, torch.tensor(LENGTHS)


def reference(model, tokens):
    """Per (layer, visit): float64 BOS mass (full and windowed) and value-norm ratio per query
    head, by loops over rows and positions."""
    names = {n for h in ("attn.hook_pattern", "attn.hook_v") for n in model.hook_names(h)}
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    out = {}
    for layer, visit in model.schedule:
        p = cache[hook_name(layer, visit, "attn.hook_pattern")].double()
        v = cache[hook_name(layer, visit, "attn.hook_v")].double()
        full = np.zeros(model.cfg.n_heads)
        win = np.zeros(model.cfg.n_heads)
        n_full = n_win = 0
        v_bos = np.zeros(model.cfg.n_kv_heads)
        v_rest = np.zeros(model.cfg.n_kv_heads)
        n_rest = 0
        for r, n in enumerate(LENGTHS):
            for i in range(1, n):
                full += p[r, :, i, 0].numpy()
                n_full += 1
                if i < WINDOW:
                    win += p[r, :, i, 0].numpy()
                    n_win += 1
                v_rest += v[r, i].norm(dim=-1).numpy()
                n_rest += 1
            v_bos += v[r, 0].norm(dim=-1).numpy()
        ratio = (v_bos / len(LENGTHS)) / (v_rest / n_rest)
        heads = np.arange(model.cfg.n_heads) // model.cfg.n_group
        out[layer, visit] = (full / n_full, win / n_win, ratio[heads])
    return out


def test_sink_columns_equal_brute_force(model, padded):
    tokens, lengths = padded
    df = sink.measure(model, tokens, lengths, batch_size=3, chunk=16)
    ref = reference(model, tokens)
    for (layer, visit), (full, win, ratio) in ref.items():
        for head in range(model.cfg.n_heads):
            r = df[(df["layer"] == layer) & (df["visit"] == visit) & (df["head"] == head)]
            assert len(r) == 1
            r = r.iloc[0]
            assert r["sink_mass"] == pytest.approx(full[head], abs=TOL)
            assert r["sink_mass_64"] == pytest.approx(win[head], abs=TOL)
            assert r["v_norm_ratio"] == pytest.approx(ratio[head], rel=TOL)
            assert r["is_sink_64"] == (win[head] > 0.3)
    windowed = np.concatenate([w for _, w, _ in ref.values()])
    # the window changes the statistic on this model, so the two columns are not the same one
    assert not np.allclose(windowed, np.concatenate([f for f, _, _ in ref.values()]), atol=1e-3)
    # a random model has no head over 0.3; a threshold at the median splits the heads, so the
    # share is checked where it is neither 0 nor 1
    cut = float(np.median(windowed))
    split = sink.measure(model, tokens, lengths, batch_size=3, chunk=16, threshold=cut)
    assert split["is_sink_64"].tolist() == [w > cut for w in split["sink_mass_64"]]
    summ = sink.summarize({"heads": split, "visits": sink.by_visit(split)}).set_index("statistic")
    pooled = summ.loc[POOLED_NAME, "value"]
    assert pooled == pytest.approx((windowed > cut).mean())
    assert 0 < (windowed > cut).mean() < 1
    summ = sink.summarize({"heads": df, "visits": sink.by_visit(df)}).set_index("statistic")
    uniform = np.mean([1 / (i + 1) for n in LENGTHS for i in range(1, n)])
    uniform_64 = np.mean([1 / (i + 1) for n in LENGTHS for i in range(1, min(n, WINDOW))])
    assert df["uniform_mass"].unique() == pytest.approx([uniform], abs=1e-12)
    assert df["uniform_mass_64"].unique() == pytest.approx([uniform_64], abs=1e-12)
    assert summ.loc["uniform-attention level at this length", "value"] == pytest.approx(uniform)
    visits = sink.by_visit(df)
    assert {"share_sink_heads_64", "sink_mass_64", "v_norm_ratio", "uniform_mass"} <= set(visits)


def test_trainer_sink_record_equals_brute_force(model, padded):
    tokens, _ = padded
    record = sink_record(model, tokens, tokens != PAD_ID)
    ref = reference(model, tokens)
    for (layer, visit), (full, _, _) in ref.items():
        assert record[f"sink_mass/{layer}.{visit}"] == pytest.approx(full.mean(), abs=TOL)
    windowed = np.concatenate([w for _, w, _ in ref.values()])
    assert record["sink03_64"] == pytest.approx((windowed > 0.3).mean())
    cut = float(np.median(windowed))
    split = sink_record(model, tokens, tokens != PAD_ID, threshold=cut)
    assert split["sink03_64"] == pytest.approx((windowed > cut).mean())
    assert 0 < split["sink03_64"] < 1


def tiny_smelt_run() -> dict:
    """The tiny preset's SMELT, shortened to 8 steps with an evaluation every 4."""
    from smelt_interp.train.presets import get_preset

    preset = get_preset("dyck-pair-tiny")
    return {
        **preset,
        "arch": "smelt",
        "data": {"dyck": 1.0},
        "seq_len": 96,
        "batch_size": 4,
        "warmup_steps": 2,
        "steps": 8,
        "eval_every": 4,
        "ckpt_every": 100,
        "dyck_eval_n": 4,
        "eval_rows": 2,
    }


def test_trainer_eval_records_the_sink_and_the_figure_draws_it(tmp_path):
    """Every evaluation logs sink_mass per (layer, visit) and Sink^0.3; the final record equals
    the statistic recomputed on the saved model; sink_history reads it back (skipping branch
    evaluations and broken lines) and the figure draws a panel per (layer, visit)."""
    from smelt_interp.checkpoint import load_checkpoint
    from smelt_interp.figures.sink_training import POOLED_TITLE, SHARE_TITLE, sink_over_training
    from smelt_interp.train.config import TrainConfig
    from smelt_interp.train.data import TrainingData
    from smelt_interp.train.sink_eval import heldout_sink, sink_history
    from smelt_interp.train.trainer import Trainer

    cfg = TrainConfig.from_dict(tiny_smelt_run())
    Trainer(cfg, tmp_path, progress=False).run()
    metrics = tmp_path / "metrics.jsonl"
    evals = [r for r in map(json.loads, metrics.read_text().splitlines()) if r["event"] == "eval"]
    model, _ = load_checkpoint(tmp_path / "ckpt.pt")
    keys = {f"sink_mass/{layer}.{visit}" for layer, visit in model.schedule}
    assert [r["step"] for r in evals] == [4, 8] and len(model.schedule) == 6
    for rec in evals:
        assert keys <= set(rec) and 0 <= rec["sink03_64"] <= 1 and 0 <= rec["sink03_gu"] <= 1
        assert all(0 < rec[k] < 1 for k in keys)
    data = TrainingData(cfg)
    again = heldout_sink(model.eval(), data.heldout(data.eval_domains[0], cfg.eval.rows))
    assert again == pytest.approx({k: evals[-1][k] for k in again}, abs=1e-6)

    with metrics.open("a") as fh:
        fh.write(json.dumps({**evals[-1], "branch": 8, "step": 99}) + "\n{not json\n[1]\n")
        fh.write(json.dumps({"event": "eval", "step": 9, "sink_mass/x": 1, "sink_mass/1.0": "a"}))
    history = sink_history(metrics)
    assert sorted(history["step"].unique()) == [4, 8] and len(history) == 2 * 6
    last = history[(history["step"] == 8) & (history["layer"] == 1) & (history["visit"] == 1)]
    assert last["sink_mass"].item() == pytest.approx(evals[-1]["sink_mass/1.1"])
    assert sink_history(tmp_path / "missing.jsonl").empty

    fig = sink_over_training({"smelt": history, "empty": sink_history(tmp_path / "none")})
    titles = [a.text for a in fig.layout.annotations]
    assert titles[0] == SHARE_TITLE and "layer 1 · visit 1" in titles and len(titles) == 7
    assert len(fig.data) == 7 and {t.name for t in fig.data} == {"smelt"}
    assert list(fig.data[0].y) == pytest.approx([r["sink03_gu"] for r in evals])
    # a log written before the trainer recorded Gu et al.'s figure: the pooled one, said so
    old = history.assign(sink03_gu=None)
    fig = sink_over_training({"smelt": history, "old": old})
    assert fig.layout.annotations[0].text == POOLED_TITLE
    assert list(fig.data[0].y) == pytest.approx([r["sink03_64"] for r in evals])
    assert "no sink records" in str(sink_over_training({}).layout.annotations[0].text)
