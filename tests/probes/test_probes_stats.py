"""Every probe statistic against a brute-force float64 reference built from the explicit
pattern (hook_pattern) and the cached activations, on random-init GQA models with right-padded
rows of different lengths; chunked attention statistics against unchunked ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from smelt_interp import hook_name
from smelt_interp.data.dyck import dyck_batch
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.errors import ProbeError, TokenError
from smelt_interp.measure import attention_stats
from smelt_interp.measure.case_tables import dyck_heads
from smelt_interp.measure.dyck_score import STOP_IDS, answer_positions, answer_scores
from smelt_interp.measure.sink import bos_columns
from smelt_interp.probes import (
    lens,
    residual,
    routing,
    similarity,
    sink,
)
from smelt_interp.probes.inputs import dyck_prompts

LENGTHS = [24, 15, 6]
ATOL = 2e-5


@pytest.fixture
def model(make_cfg, make_model):
    """SMELT, layers 1..2 looped, 4 query heads on 2 kv heads, patterns far from uniform."""
    return make_model(make_cfg(init_std=0.3, max_seq_len=128), seed=1)


@pytest.fixture
def baseline(make_cfg, make_model):
    return make_model(make_cfg(looped=False, init_std=0.3, max_seq_len=128), seed=2)


@pytest.fixture
def padded(make_tokens):
    tokens = make_tokens(len(LENGTHS), max(LENGTHS), seed=3)
    for row, n in enumerate(LENGTHS):
        tokens[row, n:] = PAD_ID
    return tokens, torch.tensor(LENGTHS)


def cached(model, tokens, *hooks):
    """Every (layer, visit)'s `hooks`, the patterns through the explicit path, in float64."""
    names = {n for h in hooks for n in model.hook_names(h)}
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    return {k: v.detach().double() if v.is_floating_point() else v for k, v in cache.items()}


def row(df, **where):
    mask = np.ones(len(df), dtype=bool)
    for col, value in where.items():
        mask &= (df[col] == value).to_numpy()
    assert mask.sum() == 1, where
    return df[mask].iloc[0]


def test_sink_mass_matches_pattern(model, padded):
    tokens, lengths = padded
    df = sink.measure(model, tokens, lengths, batch_size=2, chunk=5)
    cache = cached(model, tokens, "attn.hook_pattern")
    assert len(df) == len(model.schedule) * model.cfg.n_heads
    for depth, (layer, visit) in enumerate(model.schedule):
        p = cache[hook_name(layer, visit, "attn.hook_pattern")]
        ref = sum(p[b, :, 1:n, 0].sum(-1) for b, n in enumerate(LENGTHS)) / sum(
            n - 1 for n in LENGTHS
        )
        for head in range(model.cfg.n_heads):
            r = row(df, layer=layer, visit=visit, head=head)
            assert r["depth"] == depth
            assert r["sink_mass"] == pytest.approx(float(ref[head]), abs=ATOL)
            assert r["is_sink"] == (r["sink_mass"] > 0.3)
    # padding is excluded: the padded positions' attention would change the mean
    unpadded = sink.measure(model, tokens[1:2, :6], None)
    per_row = sink.measure(model, tokens[1:2], [6])
    assert np.allclose(unpadded["sink_mass"], per_row["sink_mass"], atol=1e-6)


def test_routing_overlap_matches_cached_indices(model, padded):
    tokens, lengths = padded
    tables = routing.tables(model, tokens, lengths, batch_size=2)
    ov, usage = tables["overlap"], tables["usage"]
    cache = cached(model, tokens, "moe.hook_expert_indices")
    k, e = model.cfg.top_k, model.cfg.n_experts
    assert sorted(ov["layer"]) == list(model.cfg.looped_layers)
    for layer in model.cfg.looped_layers:
        a = cache[hook_name(layer, 0, "moe.hook_expert_indices")]
        b = cache[hook_name(layer, 1, "moe.hook_expert_indices")]
        shared = [
            len(set(a[r, t].tolist()) & set(b[r, t].tolist()))
            for r, n in enumerate(LENGTHS)
            for t in range(n)
        ]
        r = row(ov, layer=layer)
        assert r["overlap"] == pytest.approx(np.mean(shared), abs=1e-9)
        assert r["chance_even_use"] == pytest.approx(k * k / e)
        # chance from the two visits' own expert shares: sum_e k^2 u0(e) u1(e)
        u = [
            np.bincount(
                np.concatenate([x[i, :n].reshape(-1).numpy() for i, n in enumerate(LENGTHS)]),
                minlength=e,
            )
            / (k * sum(LENGTHS))
            for x in (a, b)
        ]
        assert r["chance"] == pytest.approx(k * k * float((u[0] * u[1]).sum()), abs=1e-12)
        assert r["n_tokens"] == sum(LENGTHS)
        for j in range(k + 1):
            assert r[f"p_{j}"] == pytest.approx(np.mean(np.array(shared) == j), abs=1e-9)
    for layer, visit in model.schedule:
        idx = cache[hook_name(layer, visit, "moe.hook_expert_indices")]
        chosen = torch.cat([idx[r, :n].reshape(-1) for r, n in enumerate(LENGTHS)])
        for ex in range(e):
            assert row(usage, layer=layer, visit=visit, expert=ex)["share"] == pytest.approx(
                float((chosen == ex).double().mean()), abs=1e-9
            )


def test_routing_refuses_a_baseline(baseline, padded):
    with pytest.raises(ProbeError, match="not looped"):
        routing.measure(baseline, *padded)


def _ref_top_overlap(pa, pb, top=8):
    """Mean over valid queries that see more than `top` keys (i >= top) of
    |top(a) & top(b)| / top; per head."""
    out = np.zeros(pa.shape[1])
    count = 0
    for b, n in enumerate(LENGTHS):
        for i in range(top, n):
            m = top
            for h in range(pa.shape[1]):
                ta = set(np.argsort(-pa[b, h, i, : i + 1].numpy(), kind="stable")[:m])
                tb = set(np.argsort(-pb[b, h, i, : i + 1].numpy(), kind="stable")[:m])
                out[h] += len(ta & tb) / m
            count += 1
    return out / count


def test_top8_overlap_ignores_queries_with_8_or_fewer_keys():
    """Hand-made: one head, d_head 1, q = 1. Computation a scores key j by +j (its top 8 are the
    8 latest keys), b by -j (the 8 earliest). Query i >= 8 shares |{i-7..i} & {0..7}| = 15 - i
    of 8; queries 0..7 see at most 8 keys, share all of them in both, and must not count."""
    t = 12
    q = torch.ones(2, t, 1, 1)
    k_a = torch.arange(t, dtype=torch.float32).view(1, t, 1, 1).expand(2, -1, -1, -1)
    valid = torch.ones(2, t, dtype=torch.bool)
    valid[1, 9:] = False  # the second row counts query 8 only
    expected = [sum(15 - i for i in range(8, 12)) / 8, (15 - 8) / 8]
    for chunk in (None, 3, 5):
        got = attention_stats.topk_overlap_sum(q, k_a, q, -k_a, valid, top=8, chunk=chunk)
        assert got[:, 0].tolist() == pytest.approx(expected)
    assert int(attention_stats.overlap_count(valid, 8)) == 5
    # so the mean is 26/40 = 0.65; counting the early queries (1 each) would give 34/49


def _ref_cos(x, y):
    """Mean over valid tokens of the per-head cosine: [b, T, h, d] -> [h]."""
    vals = [F.cosine_similarity(x[b, :n], y[b, :n], dim=-1) for b, n in enumerate(LENGTHS)]
    return torch.cat(vals).mean(0)


def test_similarity_matches_reference(model, padded):
    tokens, lengths = padded
    df = similarity.measure(model, tokens, lengths, batch_size=2, chunk=7)
    cache = cached(model, tokens, "attn.hook_pattern", "attn.hook_q", "attn.hook_k", "attn.hook_v")
    g = model.cfg.n_group

    def get(layer, visit, h):
        return cache[hook_name(layer, visit, h)]

    for layer in model.cfg.looped_layers:
        top = _ref_top_overlap(
            get(layer, 0, "attn.hook_pattern"), get(layer, 1, "attn.hook_pattern")
        )
        ctrl_top = _ref_top_overlap(
            get(layer, 0, "attn.hook_pattern"), get(layer + 1, 0, "attn.hook_pattern")
        )
        cos = {
            x: _ref_cos(get(layer, 0, f"attn.hook_{x}"), get(layer, 1, f"attn.hook_{x}"))
            for x in "qkv"
        }
        ctrl = {
            x: _ref_cos(get(layer, 0, f"attn.hook_{x}"), get(layer + 1, 0, f"attn.hook_{x}"))
            for x in "qkv"
        }
        for head in range(model.cfg.n_heads):
            r = row(df, layer=layer, head=head)
            assert r["control_layer"] == layer + 1 and r["kv_head"] == head // g
            assert r["top8_overlap"] == pytest.approx(top[head], abs=1e-9)
            assert r["ctrl_top8_overlap"] == pytest.approx(ctrl_top[head], abs=1e-9)
            for x in "qkv":
                h = head if x == "q" else head // g
                assert r[f"cos_{x}"] == pytest.approx(float(cos[x][h]), abs=ATOL)
                assert r[f"ctrl_cos_{x}"] == pytest.approx(float(ctrl[x][h]), abs=ATOL)
    # identical visits would give cosine 1 and full overlap: the statistic can tell
    assert (df["cos_q"] < 0.999).any() and (df["top8_overlap"] < 1).any()


def test_similarity_on_a_baseline_has_only_the_control(baseline, padded):
    df = similarity.measure(baseline, *padded)
    assert not any(c in df for c in ("cos_q", "top8_overlap"))
    assert sorted(df["layer"].unique()) == list(range(baseline.cfg.n_layers - 1))
    assert df[["ctrl_cos_q", "ctrl_cos_k", "ctrl_cos_v", "ctrl_top8_overlap"]].notna().all().all()


def test_residual_norms_match_cache(model, padded):
    tokens, lengths = padded
    df = residual.measure(model, tokens, lengths, batch_size=2)
    cache = cached(
        model, tokens, "hook_attn_out", "hook_mlp_out", "hook_resid_pre", "hook_resid_mid"
    )
    for layer, visit in model.schedule:
        for sub, (w, res) in residual.SUBLAYERS.items():
            wn = torch.cat(
                [
                    cache[hook_name(layer, visit, w)][b, :n].norm(dim=-1)
                    for b, n in enumerate(LENGTHS)
                ]
            )
            rn = torch.cat(
                [
                    cache[hook_name(layer, visit, res)][b, :n].norm(dim=-1)
                    for b, n in enumerate(LENGTHS)
                ]
            )
            r = row(df, layer=layer, visit=visit, sublayer=sub)
            assert r["write_norm"] == pytest.approx(float(wn.mean()), rel=1e-5)
            assert r["resid_norm"] == pytest.approx(float(rn.mean()), rel=1e-5)
            assert r["relative"] == pytest.approx(float((wn / rn).mean()), rel=1e-5)


@pytest.fixture
def dyck_examples():
    return dyck_prompts(3, (0, 2), max_seq_len=128, seed=5)


def test_dyck_answer_positions_and_masses(model, dyck_examples):
    ex = dyck_examples[-1]
    # the positions predicting the answer: the space after "Output:" through the
    # second-to-last answer token
    start, end = ex.answer_span
    assert ex.text[start - 2 : start - 1] == " " and ex.ids[start - 1] == ord(" ")
    pos, valid = answer_positions([ex.answer_span])
    assert pos[0].tolist() == list(range(start - 1, end - 1)) and bool(valid.all())

    df = dyck_heads(model, dyck_examples, batch_size=2, chunk=4)
    for n_demos in (0, 2):
        group = [e for e in dyck_examples if e.n_demos == n_demos]
        tokens, _ = dyck_batch(group)
        cache = cached(model, tokens, "attn.hook_pattern")
        for layer, visit in model.schedule:
            p = cache[hook_name(layer, visit, "attn.hook_pattern")]
            bos, demo, n = 0.0, 0.0, 0
            for b, e in enumerate(group):
                demo_keys = [k for s, t in e.demo_answer_spans for k in range(s, t)]
                for i in range(e.answer_span[0] - 1, e.answer_span[1] - 1):
                    bos = bos + p[b, :, i, 0]
                    demo = demo + p[b, :, i, demo_keys].sum(-1)
                    n += 1
            for head in range(model.cfg.n_heads):
                r = row(df, n_demos=n_demos, layer=layer, visit=visit, head=head)
                assert r["bos_mass"] == pytest.approx(float(bos[head] / n), abs=ATOL)
                assert r["demo_mass"] == pytest.approx(
                    float(demo[head] / n) if n_demos else 0.0, abs=ATOL
                )


class Oracle(torch.nn.Module):
    """A stand-in model whose forward returns fixed logits (for the trainer's scorer)."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.logits = logits

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.logits[: tokens.shape[0], : tokens.shape[1]]


def test_teacher_forced_exact_match_is_the_trainers(dyck_examples):
    """Right answer tokens are not enough: greedy decoding must also stop after them (the
    trainer's definition, measure.dyck_score.teacher_forced_exact_match)."""
    from smelt_interp.measure.dyck_score import teacher_forced_exact_match

    tokens, _ = dyck_batch(dyck_examples)
    spans = [e.answer_span for e in dyck_examples]
    following = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], PAD_ID)], dim=1)
    logits = F.one_hot(following, 259).double()  # argmax: the next token, PAD after the text
    right, exact = answer_scores(logits, tokens, spans)
    assert right.tolist() == [t - s for s, t in spans] and bool(exact.all())
    start, end = spans[0]
    logits[0, end - 1] = F.one_hot(torch.tensor(ord("(")), 259)  # no stop after the answer
    right, exact = answer_scores(logits, tokens, spans)
    assert int(right[0]) == end - start and not bool(exact[0]) and bool(exact[1:].all())
    assert exact.tolist() == teacher_forced_exact_match(Oracle(logits), dyck_examples)


def test_lens_matches_manual_unembedding(model, dyck_examples):
    tokens, lengths = dyck_batch(dyck_examples)
    spans = [e.answer_span for e in dyck_examples]
    df = lens.measure(model, tokens, lengths, answer_spans=spans, batch_size=4)
    cache = cached(model, tokens, "hook_resid_post")
    assert list(df["depth"]) == list(range(len(model.schedule)))
    assert list(df.loc[df["loop_boundary"], "depth"]) == [2, 4]  # 0, 1, 2 | 1, 2 | 3
    for depth, (layer, visit) in enumerate(model.schedule):
        with torch.no_grad():
            logits = model.unembed(
                model.ln_final(cache[hook_name(layer, visit, "hook_resid_post")].float())
            ).double()
        nll = [
            F.cross_entropy(logits[b, : n - 1], tokens[b, 1:n], reduction="none")
            for b, n in enumerate(lengths.tolist())
        ]
        r = row(df, depth=depth)
        assert r["ce"] == pytest.approx(float(torch.cat(nll).mean()), rel=1e-5)
        pred = logits.argmax(-1)
        hits = [
            [int(pred[b, i - 1]) == int(tokens[b, i]) for i in range(s, t)]
            for b, (s, t) in enumerate(spans)
        ]
        stops = [int(pred[b, t - 1]) in STOP_IDS for b, (_, t) in enumerate(spans)]
        assert r["answer_token_acc"] == pytest.approx(np.mean([h for hs in hits for h in hs]))
        assert r["answer_exact"] == pytest.approx(
            np.mean([all(hs) and stop for hs, stop in zip(hits, stops)])
        )
    # the last depth is the model's own output
    with torch.no_grad():
        out = model(tokens).double()
    nll = [
        F.cross_entropy(out[b, : n - 1], tokens[b, 1:n], reduction="none")
        for b, n in enumerate(lengths.tolist())
    ]
    assert df["ce"].iloc[-1] == pytest.approx(float(torch.cat(nll).mean()), rel=1e-5)


def test_bad_batches_are_refused(model, padded):
    tokens, _ = padded
    no_bos = tokens.clone()
    no_bos[0, 0] = 5
    with pytest.raises(TokenError, match="BOS"):
        sink.measure(model, no_bos)
    with pytest.raises(TokenError, match="lengths"):
        sink.measure(model, tokens, [24, 15, 0])
    with pytest.raises(TokenError, match="max_seq_len"):
        sink.measure(model, torch.full((1, 200), 257))


# ----- chunking -------------------------------------------------------------------------


def _qk(model, tokens, layer, visit):
    names = [hook_name(layer, visit, "attn.hook_q"), hook_name(layer, visit, "attn.hook_k")]
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    return cache[names[0]], cache[names[1]]


def test_chunked_statistics_equal_unchunked_at_512(make_cfg, make_model, make_tokens):
    model = make_model(make_cfg(init_std=0.3, max_seq_len=512), seed=4)
    tokens = make_tokens(1, 512, seed=4)
    valid = torch.ones(1, 512, dtype=torch.bool)
    qa, ka = _qk(model, tokens, 1, 0)
    qb, kb = _qk(model, tokens, 1, 1)
    assert torch.allclose(
        bos_columns(qa, ka, valid, chunk=64).sum(dim=-1),
        bos_columns(qa, ka, valid, chunk=None).sum(dim=-1),
        rtol=1e-6,
    )
    assert torch.equal(
        attention_stats.topk_overlap_sum(qa, ka, qb, kb, valid, chunk=64),
        attention_stats.topk_overlap_sum(qa, ka, qb, kb, valid, chunk=None),
    )
    # and the rows themselves are the model's own pattern
    with model.explicit_attention([(1, 0)]):
        names = [hook_name(1, 0, "attn.hook_pattern")]
        _, cache = model.run_with_cache(tokens[:, :128], names_filter=lambda n: n in names)
    assert torch.allclose(
        attention_stats.pattern(qa[:, :128], ka[:, :128]), cache[names[0]], atol=1e-6
    )


class MaxNumel(TorchDispatchMode):
    """Records the largest tensor any op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.largest = max(self.largest, leaf.numel())
        return out


def test_4096_tokens_run_in_bounded_memory(make_cfg, make_model, make_tokens):
    model = make_model(
        make_cfg(n_layers=2, init_std=0.3, max_seq_len=4096), seed=6
    )  # schedule 0, 0, 1
    tokens = make_tokens(1, 4096, seed=6)
    chunk, heads = 64, model.cfg.n_heads
    with MaxNumel() as spy:
        df = sink.measure(model, tokens, chunk=chunk)
    assert df["sink_mass"].between(0, 1).all()
    bound = heads * chunk * 4096 * 2  # one chunk of scores (and a float64 copy's worth)
    assert spy.largest <= bound < 4096 * 4096  # never a [T, T] pattern, not even for one head
