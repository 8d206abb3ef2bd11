"""torch.compile (inductor, CPU) against the eager reference: the same 20-step loss curve and
the same logits for both architectures, the MoE block and the whole forward compile as one
graph (no host sync), one compiled Block graph serves every layer and visit with one graph per
row length (alternating lengths never recompile), and probe runs (hooks) still work on a
trainer that compiles.

The two compiled trainers are built once per module (compiling is the slow part)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from smelt_interp.config import ModelConfig
from smelt_interp.model.moe import MoE, MoEHooks
from smelt_interp.model.protocol import hook_name
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import get_preset
from smelt_interp.train.trainer import Trainer

STEPS = 20
# float32 kernels fused differently. Measured: logits differ by <= 3e-7, the 20 per-step losses
# by <= 1e-5 (both architectures); the tolerances leave a 20-30x margin and stay far below the
# ~3 nats the curve falls.
LOGIT_TOL = 1e-5
LOSS_TOL = 2e-4


def _trainer(arch: str, compile_model: bool, out: Path) -> Trainer:
    cfg = TrainConfig.from_dict(
        {
            **get_preset("dyck-pair-tiny"),
            "arch": arch,
            "compile": compile_model,
            "threads": 1,
            "steps": STEPS,
        }
    )
    return Trainer(cfg, out, progress=False)


@pytest.fixture(scope="module", params=["baseline", "smelt"])
def pair(request, tmp_path_factory) -> dict:
    """Eager and compiled trainers of one architecture, from the same seed: the first batch's
    logits of each, then STEPS training losses of each."""
    arch = request.param
    root = tmp_path_factory.mktemp(arch)
    out: dict = {"arch": arch}
    for mode in ("eager", "compiled"):
        trainer = _trainer(arch, mode == "compiled", root / mode)
        tokens = trainer.data.batch_at(0, 0)
        logits = trainer.forward_model(tokens)  # the module train_step calls (compiled or not)
        out[f"{mode}_logits"] = logits.detach()
        trainer.optimizer.zero_grad(set_to_none=True)
        out[f"{mode}_losses"] = [
            trainer.train_step(trainer.cfg.optim.lr)["loss"] for _ in range(STEPS)
        ]
        out[mode] = trainer
    return out


def test_compiled_forward_equals_eager(pair: dict) -> None:
    assert all(b.compiled is not None for b in pair["compiled"].model.blocks)  # it compiles
    eager, compiled = pair["eager_logits"], pair["compiled_logits"]
    assert eager.abs().max() > 0.1
    torch.testing.assert_close(compiled, eager, atol=LOGIT_TOL, rtol=LOGIT_TOL)


def test_compiled_loss_curve_equals_eager(pair: dict) -> None:
    eager, compiled = pair["eager_losses"], pair["compiled_losses"]
    assert eager[0] - eager[-1] > 1.0  # the run learns, so the curve says something
    diffs = [abs(a - b) for a, b in zip(eager, compiled)]
    assert max(diffs) < LOSS_TOL, f"{pair['arch']}: eager {eager}\ncompiled {compiled}"


def test_hooked_run_on_compiling_trainer(pair: dict) -> None:
    """Probes run the trainer's eager model: hooks fire on every visit and see the values the
    eager reference (same weights) computes."""
    trainer = pair["compiled"]
    model = trainer.model
    reference = SmeltModel(model.cfg).eval()
    reference.load_state_dict(model.state_dict())
    tokens = trainer.data.batch_at(STEPS, 0)[:2]
    names = model.hook_names("moe.hook_router_logits") + model.hook_names("attn.hook_q")
    model.eval()
    try:
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=names)
            _, want = reference.run_with_cache(tokens, names_filter=names)
    finally:
        model.train()
    assert sorted(cache.keys()) == sorted(names)
    for name in names:
        torch.testing.assert_close(cache[name], want[name], atol=1e-5, rtol=1e-5)
    layer, visit = model.schedule[-1]
    assert cache[hook_name(layer, visit, "moe.hook_router_logits")].abs().max() > 0


def _tiny_model_cfg() -> ModelConfig:
    return ModelConfig.smelt(
        d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_head=8, n_experts=4, top_k=2,
        d_expert=16, max_seq_len=64,
    )  # fmt: skip


def test_moe_block_compiles_as_one_graph() -> None:
    """fullgraph=True fails on any graph break: a .item()/.tolist() host sync, or a kernel whose
    fake-tensor rule refuses float32 (as F.grouped_mm's does). aot_eager traces the backward
    too, without code generation."""
    torch.manual_seed(0)
    moe = MoE(_tiny_model_cfg())
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.3)
    hooks = MoEHooks()
    x = torch.randn(2, 9, 32, requires_grad=True)
    compiled = torch.compile(moe, fullgraph=True, backend="aot_eager")
    outs = []
    for fn in (compiled, moe):
        y, losses = fn(x, hooks)
        (y.square().sum() + losses.load_balance + losses.z_loss).backward()
        outs.append((y.detach(), losses.load_balance.detach(), x.grad.clone()))
        x.grad = None
    for got, want in zip(*outs):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_whole_forward_compiles_as_one_graph() -> None:
    torch.manual_seed(0)
    model = SmeltModel(_tiny_model_cfg()).train()
    tokens = torch.randint(0, model.cfg.vocab_size, (2, 12))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = compiled(tokens)
    got_balance = model.aux_losses["load_balance"]
    torch.testing.assert_close(got, model(tokens), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_balance, model.aux_losses["load_balance"])


@pytest.mark.parametrize("looped", [False, True])
def test_one_block_graph_serves_every_layer_and_visit_per_row_length(looped: bool) -> None:
    """compile_blocks: the 4 layers' 4 (Baseline) or 6 (SMELT) visits run one compiled graph per
    row length; lengths that alternate step by step (16, 24, 16, ...) compile twice in all, not
    once a step nor once a layer, and give the eager model's logits and gradients."""
    cfg = _tiny_model_cfg()
    cfg = cfg if looped else ModelConfig.baseline(**{**cfg.to_dict(), "name": "baseline"})
    torch.manual_seed(0)
    model = SmeltModel(cfg).train()
    eager = SmeltModel(cfg).train()
    eager.load_state_dict(model.state_dict())
    model.compile_blocks(backend="aot_eager")
    torch._dynamo.reset()
    counters.clear()
    for length in (16, 24) * 3:
        tokens = torch.randint(0, cfg.vocab_size, (2, length))
        got, want = model(tokens), eager(tokens)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        got.square().mean().backward()
        want.square().mean().backward()
    assert len(model.schedule) == (6 if looped else 4)
    assert counters["stats"]["unique_graphs"] == 2
    for a, b in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)
