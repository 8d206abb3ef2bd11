"""Budgets against the real thing: parameter counts against the module's tensors, FLOPs
against torch's FlopCounterMode, KV bytes against a filled KVCache; sparsity by hand, and one S
for a matched pair; the matcher at three Baseline sizes and its width and expert steps; and the
command line."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from smelt_interp.budget import (
    Budget,
    budget_table,
    dense_flops_per_token,
    flops_per_token,
    kv_bytes_per_token,
    match_smelt,
    non_embedding_params,
    pair_sparsity,
    param_breakdown,
    sparsity,
)
from smelt_interp.config import ModelConfig
from smelt_interp.errors import ConfigError, MatchError
from smelt_interp.model.kv_cache import KVCache
from smelt_interp.train.presets import PRESETS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("looped", [False, True])
@pytest.mark.parametrize(
    "shape", [{}, {"n_kv_heads": 1, "n_experts": 6, "top_k": 3, "d_expert": 20}]
)
def test_non_embedding_params_exact(make_cfg, make_model, looped, shape) -> None:
    model = make_model(make_cfg(looped=looped, **shape))
    non_embed = sum(
        p.numel() for n, p in model.named_parameters() if not n.startswith(("embed.", "unembed."))
    )
    assert non_embedding_params(model.cfg) == non_embed
    parts = param_breakdown(model.cfg)
    assert parts["embedding"] == model.embed.weight.numel() + model.unembed.weight.numel()
    assert parts["non_embedding"] + parts["embedding"] == sum(p.numel() for p in model.parameters())


def _sdpa_counted() -> bool:
    """Does FlopCounterMode count the CPU fused attention kernel?"""
    from torch.utils.flop_counter import flop_registry

    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    return op is not None and (op in flop_registry or op.default in flop_registry)


@pytest.mark.parametrize("explicit", [True, False])
@pytest.mark.parametrize("looped, n_kv_heads, top_k", [(True, 2, 2), (False, 1, 3), (True, 4, 1)])
def test_flops_match_flop_counter(
    make_cfg, make_model, make_tokens, explicit, looped, n_kv_heads, top_k
) -> None:
    model = make_model(make_cfg(looped=looped, n_kv_heads=n_kv_heads, top_k=top_k))
    model.set_dispatch("loop")
    batch, seq = 2, 24
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        with model.explicit_attention() if explicit else contextlib.nullcontext():
            model(make_tokens(batch, seq))
    measured = counter.get_total_flops() / (batch * seq)
    predicted = flops_per_token(model.cfg, seq, include_unembedding=True)
    if not explicit and not _sdpa_counted():
        # the counter does not see the fused CPU kernel: take its scores and values out
        cfg = model.cfg
        predicted -= cfg.effective_depth * 2 * 2 * cfg.n_heads * cfg.d_head * seq
    assert measured == pytest.approx(predicted, rel=0.02)


def test_flops_hand_case_and_sparsity() -> None:
    """d 8, 1 layer, 2 heads of 4 (1 KV head), 4 experts of 8, top-1, 16 tokens. S is measured
    against a dense control with the same non-embedding parameters, each used once per token,
    plus attention once per physical layer (DESIGN.md, budgets)."""
    cfg = ModelConfig.baseline(
        d_model=8,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        d_head=4,
        n_experts=4,
        top_k=1,
        d_expert=8,
        max_seq_len=16,
    )
    # projections 2*8*4*(2+1) = 192, router 32, one expert 3*8*8 = 192, attention 4*2*4*16 = 512
    assert flops_per_token(cfg, 16) == 2 * (192 + 32 + 192) + 512 == 1344
    assert flops_per_token(cfg, 16, all_experts=True) == 2 * (192 + 32 + 4 * 192) + 512 == 2496
    assert flops_per_token(cfg, 16, include_unembedding=True) == 1344 + 2 * 8 * 259
    # non-embedding: 192 + 4 experts 768 + router 32 + norms (2*1 + 1)*8 = 24 -> 1016
    assert non_embedding_params(cfg) == 1016
    assert dense_flops_per_token(cfg, 16) == 2 * 1016 + 512 == 2544
    assert sparsity(cfg, 16) == pytest.approx(1 - 1344 / 2544) == pytest.approx(25 / 53)
    # every expert active: the control still has 2 x the norms' 24 parameters more
    assert sparsity(cfg.replace(top_k=4), 16) == pytest.approx(48 / 2544) == pytest.approx(1 / 53)
    # looped: active FLOPs count a layer once per visit, the dense control once per layer.
    # 4 layers, layers 1..2 twice: 6 visits x 1344 = 8064 active; 4 x (192 + 768 + 32) + 9 x 8
    # = 4040 parameters -> dense 2 x 4040 + 4 x 512 = 10128
    looped = cfg.replace(n_layers=4, loop_start=1, loop_end=3, n_loops=2)
    assert flops_per_token(looped, 16) == 6 * 1344 == 8064
    assert dense_flops_per_token(looped, 16) == 2 * 4040 + 4 * 512 == 10128
    assert sparsity(looped, 16) == pytest.approx(1 - 8064 / 10128) == pytest.approx(43 / 211)
    with pytest.raises(ConfigError, match="seq_len"):
        flops_per_token(cfg, 0)
    with pytest.raises(ConfigError, match="seq_len"):
        dense_flops_per_token(cfg, 0)


def test_dense_control_counts_the_modules_parameters(make_cfg, make_model) -> None:
    """F_dense = 2 x the model's non-embedding tensors' elements + attention per physical
    layer, counted from the module rather than the config."""
    model = make_model(make_cfg(looped=True))
    cfg, seq = model.cfg, 24
    tensors = sum(
        p.numel() for n, p in model.named_parameters() if not n.startswith(("embed.", "unembed."))
    )
    attention = cfg.n_layers * 4 * cfg.n_heads * cfg.d_head * seq
    assert cfg.effective_depth > cfg.n_layers  # the loop must not enter the control
    assert dense_flops_per_token(cfg, seq) == 2 * tensors + attention


@pytest.mark.parametrize(
    "shape",
    [
        {},  # the default pair's Baseline (presets.py), at its training length
        {"d_model": 256, "n_layers": 8, "n_experts": 8, "d_expert": 256, "d_head": 64},
    ],
)
def test_matched_pair_shares_one_sparsity(shape) -> None:
    """A matched pair has one S, its Baseline's, wherever it is read: Match.sparsity,
    pair_sparsity and both rows of budget_table. The default pair's is 0.5616 (SMELT's own
    count, 0.5421, differs by its FLOP and parameter mismatches)."""
    default = PRESETS["dyck-pair"]
    assert default["seq_len"] == 320
    base = ModelConfig.baseline(**{**default["model"], **shape})
    match = match_smelt(base, seq_len=320)
    S = sparsity(base, 320)
    assert match.sparsity == S == pair_sparsity(base, match.smelt, 320)
    table = budget_table({"b": base, "s": match.smelt}, 320, pair=("b", "s"))
    assert table.loc["b", "sparsity"] == table.loc["s", "sparsity"] == S
    assert table["shared_S"].all()
    # by hand from the counters: 1 - F_active / (2 N + attention per physical layer)
    attention = base.n_layers * 4 * base.n_heads * base.d_head * 320
    assert S == pytest.approx(
        1 - flops_per_token(base, 320) / (2 * non_embedding_params(base) + attention)
    )
    if not shape:
        assert S == pytest.approx(0.5616, abs=1e-4)
        assert sparsity(match.smelt, 320) == pytest.approx(0.5421, abs=1e-4)
    # without the pair, or for an unmatched pair, each model keeps its own S
    alone = budget_table({"b": base, "s": match.smelt}, 320)
    assert alone.loc["s", "sparsity"] == sparsity(match.smelt, 320) != S
    assert not alone["shared_S"].any()
    wide = match.smelt.replace(n_experts=2 * match.smelt.n_experts)
    assert pair_sparsity(base, wide, 320) is None
    unmatched = budget_table({"b": base, "s": wide}, 320, pair=("b", "s"))
    assert unmatched.loc["s", "sparsity"] == sparsity(wide, 320)
    assert not unmatched["shared_S"].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("looped, n_kv_heads", [(True, 2), (True, 1), (False, 4)])
def test_kv_bytes_match_cache(make_cfg, make_model, make_tokens, dtype, looped, n_kv_heads) -> None:
    model = make_model(make_cfg(looped=looped, n_kv_heads=n_kv_heads)).to(dtype)
    cache = KVCache()
    batch, seq = 3, 10
    with torch.no_grad():
        model(make_tokens(batch, seq), cache=cache)
    per_token = cache.nbytes() / (batch * seq)
    elem = torch.finfo(dtype).bits // 8
    assert kv_bytes_per_token(model.cfg, bytes_per_element=elem) == per_token
    assert len(cache) == model.cfg.effective_depth


def test_budget_of() -> None:
    cfg = ModelConfig.smelt(n_layers=8)
    b = Budget.of(cfg, 256)
    assert (b.params, b.flops, b.kv, b.seq_len) == (
        non_embedding_params(cfg),
        flops_per_token(cfg, 256),
        kv_bytes_per_token(cfg),
        256,
    )
    assert b.sparsity == pytest.approx(sparsity(cfg, 256))


BASELINES = [
    dict(
        d_model=256,
        n_layers=8,
        n_heads=4,
        n_kv_heads=2,
        d_head=64,
        n_experts=8,
        top_k=2,
        d_expert=256,
    ),
    dict(
        d_model=512,
        n_layers=12,
        n_heads=8,
        n_kv_heads=4,
        d_head=64,
        n_experts=32,
        top_k=8,
        d_expert=256,
    ),
    dict(
        d_model=1024,
        n_layers=24,
        n_heads=16,
        n_kv_heads=4,
        d_head=64,
        n_experts=64,
        top_k=8,
        d_expert=512,
    ),
]


@pytest.mark.parametrize("shape", BASELINES, ids=lambda s: f"d{s['d_model']}")
def test_matcher_three_sizes(shape) -> None:
    base = ModelConfig.baseline(max_seq_len=2048, **shape)
    match = match_smelt(base, seq_len=2048)
    smelt = match.smelt
    assert smelt.is_looped and smelt.n_loops == 2
    assert (smelt.loop_start, smelt.loop_end) == (base.n_layers // 4, 3 * base.n_layers // 4)
    assert smelt.n_layers == base.n_layers
    assert smelt.d_model < base.d_model
    assert smelt.n_experts > base.n_experts
    assert smelt.top_k == base.top_k
    # recompute the mismatches from the counters, independently of match.table
    for fn, tol in (
        (non_embedding_params, 0.01),
        (lambda c: flops_per_token(c, 2048), 0.04),
        (kv_bytes_per_token, 0.04),
    ):
        assert abs(fn(smelt) / fn(base) - 1) <= tol
    assert match.within_tolerance
    assert list(match.table.index) == ["params", "flops", "kv"]
    assert match.table.loc["params", "smelt"] == non_embedding_params(smelt)


@pytest.mark.parametrize(
    "steps",
    [
        {"width_step": 64},
        {"expert_step": 64},
        {"width_step": 64, "expert_step": 64},
        {"width_step": 128, "expert_step": 128},
    ],
    ids=str,
)
def test_matcher_steps_set_the_widths_it_returns(steps: dict[str, int]) -> None:
    """width_step and expert_step are the steps of SMELT's d_model and d_expert: at the default
    steps (16 and 8) this Baseline's SMELT has d_model 416 and d_expert 208, neither a multiple
    of 64; each step given changes the match, and every width is a multiple of its step."""
    base = ModelConfig.baseline(max_seq_len=2048, **BASELINES[1])
    default = match_smelt(base, seq_len=2048).smelt
    assert (default.d_model, default.d_expert) == (416, 208)
    match = match_smelt(base, seq_len=2048, **steps)
    smelt = match.smelt
    assert match.within_tolerance
    assert smelt.d_model % steps.get("width_step", 16) == 0
    assert smelt.d_expert % steps.get("expert_step", 8) == 0
    for name, width in (("width_step", "d_model"), ("expert_step", "d_expert")):
        if name in steps:  # the width moved onto the step, which the default's was off
            assert getattr(default, width) % steps[name] != 0 == getattr(smelt, width) % steps[name]


@pytest.mark.parametrize("name", ["width_step", "expert_step"])
@pytest.mark.parametrize("bad", [0, -64, 2.5, True, 1 << 20])
def test_matcher_steps_are_checked(name: str, bad: object) -> None:
    with pytest.raises(MatchError, match=f"^{name} must be a positive integer"):
        match_smelt(ModelConfig.baseline(**BASELINES[1]), **{name: bad})


def test_a_width_step_wider_than_the_baseline_finds_no_shape() -> None:
    with pytest.raises(MatchError, match="no SMELT shape fits"):
        match_smelt(ModelConfig.baseline(**BASELINES[1]), width_step=1024)


@pytest.mark.parametrize(
    "base, needle",
    [
        (ModelConfig.baseline(n_layers=1), "1 layer"),
        (ModelConfig.smelt(n_layers=8), "unlooped"),
    ],
)
def test_unmatchable_baseline_raises(base: ModelConfig, needle: str) -> None:
    with pytest.raises(MatchError) as info:
        match_smelt(base)
    assert needle in str(info.value) and "\n" not in str(info.value)


def _run_cli(*argvs: list[str]) -> list[tuple[int, str, str]]:
    """Run several `python -m smelt_interp.budget` commands concurrently (each pays the
    package's import time); return (exit code, stdout, stderr) for each."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "smelt_interp.budget", *argv],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        results.append((proc.returncode, out, err))
    return results


def test_cli_prints_table_and_rejects_bad_shape() -> None:
    ok, bad, impossible = _run_cli(
        [
            "--d-model",
            "256",
            "--n-layers",
            "8",
            "--n-heads",
            "4",
            "--n-kv-heads",
            "2",
            "--d-head",
            "64",
            "--n-experts",
            "8",
            "--top-k",
            "2",
            "--d-expert",
            "256",
            "--seq-len",
            "1024",
        ],
        ["--n-layers", "1"],
        ["--n-experts", "4", "--top-k", "8"],
    )
    assert ok[0] == 0, ok[2]
    for word in ("d_model", "n_experts", "params", "flops", "kv", "mismatch", "sparsity"):
        assert word in ok[1]
    for code, out, err, needle in (*bad, "layer"), (*impossible, "top_k"):
        lines = err.strip().splitlines()
        assert code == 2 and out == ""
        assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]
