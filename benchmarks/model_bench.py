"""Model benchmarks, each measured side by side in one run (ratios, not absolute times):

1. hook points: a forward pass with hook points but none attached, against the same weights
   in a model whose hook points are stripped out (target <= 1.03x);
2. attention: the fused SDPA path against the explicit path at 1k and 4k tokens (time and
   peak resident memory of the call);
3. MoE dispatch: grouped_mm against the per-expert loop at E = 8, 32, 64 and top-k 2, 8.

Run: python -m benchmarks.model_bench [--quick] [--threads N] [--only hooks|attention|moe]"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable, Sequence

import torch
from transformer_lens.hook_points import HookPoint

from benchmarks.measure import interleaved_medians, mib, peak_extra_rss
from smelt_interp.config import ModelConfig
from smelt_interp.model.attention import Attention, AttentionHooks
from smelt_interp.model.moe import Experts
from smelt_interp.model.rope import Rotary
from smelt_interp.model.transformer import SmeltModel


def strip_hook_points(model: SmeltModel) -> SmeltModel:
    """A copy of `model` with no HookPoint modules: each becomes a plain identity function
    (deleted from its parent's `_modules`, set as a plain attribute), and the attention's
    "is the pattern hooked?" check becomes a constant."""
    stripped = copy.deepcopy(model)

    def identity(x: torch.Tensor) -> torch.Tensor:
        return x

    def never() -> bool:
        return False

    for module in list(stripped.modules()):
        for name, child in list(module._modules.items()):
            if isinstance(child, HookPoint):
                del module._modules[name]
                object.__setattr__(module, name, identity)
        if isinstance(module, AttentionHooks):
            object.__setattr__(module, "wants_pattern", never)
    assert not any(isinstance(m, HookPoint) for m in stripped.modules())
    return stripped


def bench_hooks(quick: bool) -> list[str]:
    cfg = ModelConfig.smelt(
        d_model=256,
        n_layers=8,
        n_heads=4,
        n_kv_heads=2,
        d_head=64,
        n_experts=8,
        top_k=2,
        d_expert=256,
        max_seq_len=512,
    )
    batch, seq, repeats = (2, 256, 7) if quick else (4, 512, 11)
    torch.manual_seed(0)
    model = SmeltModel(cfg).eval()
    bare = strip_hook_points(model).eval()
    twin = copy.deepcopy(model)  # A/A control: the noise floor of this comparison
    tokens = torch.randint(0, 256, (batch, seq))
    with torch.no_grad():
        assert torch.equal(model(tokens), bare(tokens))
        t = interleaved_medians(
            {
                "hooked": lambda: model(tokens),
                "bare": lambda: bare(tokens),
                "twin": lambda: twin(tokens),
            },
            repeats,
        )
    n_hooks = len(model.hook_dict)
    ratio = t["hooked"] / t["bare"]
    return [
        f"hook points ({n_hooks} hook points, none attached; d_model 256, 8 layers looped "
        f"to depth {cfg.effective_depth}, batch {batch} x seq {seq}, median of {repeats})",
        f"  with hook points {t['hooked'] * 1e3:8.1f} ms   stripped {t['bare'] * 1e3:8.1f} ms"
        f"   ratio {ratio:.3f}x  (target <= 1.03x; A/A control, hooked copy vs hooked: "
        f"{t['twin'] / t['hooked']:.3f}x)",
    ]


# ----- 2. attention paths ------------------------------------------------------------------
def bench_attention(quick: bool) -> list[str]:
    cfg = ModelConfig(d_model=256, n_heads=8, n_kv_heads=2, d_head=32, max_seq_len=4096)
    torch.manual_seed(0)
    attn = Attention(cfg).eval()
    rotary = Rotary(cfg.d_head, cfg.max_seq_len, cfg.rope_theta)
    fused_hooks, explicit_hooks = AttentionHooks(), AttentionHooks()
    explicit_hooks.force_pattern = True
    lines = [
        f"attention paths (one layer: {cfg.n_heads} heads, {cfg.n_kv_heads} KV heads, "
        f"d_head {cfg.d_head}, batch 1)"
    ]
    for seq in (1024, 4096):
        repeats = 3 if quick or seq > 1024 else 5
        x = torch.randn(1, seq, cfg.d_model)
        with torch.no_grad():
            run = {
                "sdpa": lambda: attn(x, fused_hooks, rotary),
                "explicit": lambda: attn(x, explicit_hooks, rotary),
            }
            diff = float((run["sdpa"]() - run["explicit"]()).abs().max())
            t = interleaved_medians(run, repeats)
            mem = {name: peak_extra_rss(fn) for name, fn in run.items()}
        lines.append(
            f"  {seq:5d} tokens: sdpa {t['sdpa'] * 1e3:8.1f} ms, peak +{mib(mem['sdpa']):>9}   "
            f"explicit {t['explicit'] * 1e3:8.1f} ms, peak +{mib(mem['explicit']):>9}   "
            f"time ratio explicit/sdpa {t['explicit'] / t['sdpa']:.2f}x   max |diff| {diff:.1e}"
        )
    return lines


# ----- 3. MoE dispatch ---------------------------------------------------------------------
def bench_moe(quick: bool) -> list[str]:
    d_model, d_expert = 256, 128
    n_tokens = 1024 if quick else 2048
    repeats = 3 if quick else 5
    lines = [
        f"MoE dispatch (d_model {d_model}, d_expert {d_expert}, {n_tokens} tokens, "
        f"forward; forward+backward in brackets)"
    ]
    for n_experts in (8, 32, 64):
        for k in (2, 8):
            torch.manual_seed(0)
            experts = Experts(
                ModelConfig(d_model=d_model, d_expert=d_expert, n_experts=n_experts, top_k=k)
            )
            for p in experts.parameters():
                torch.nn.init.normal_(p, std=0.02)
            x = torch.randn(n_tokens, d_model)
            logits = torch.randn(n_tokens, n_experts)
            top_w, top_i = logits.softmax(-1).topk(k, dim=-1)
            top_w = top_w / top_w.sum(-1, keepdim=True)
            proj = torch.randn(n_tokens, d_model)

            def fwd(dispatch: str) -> Callable[[], object]:
                def run() -> object:
                    with torch.no_grad():
                        return experts(x, top_i, top_w, dispatch)

                return run

            def fwd_bwd(dispatch: str) -> Callable[[], object]:
                def run() -> object:
                    experts.zero_grad(set_to_none=True)
                    (experts(x, top_i, top_w, dispatch) * proj).sum().backward()

                return run

            t = interleaved_medians(
                {
                    "grouped": fwd("grouped"),
                    "loop": fwd("loop"),
                    "grouped_bwd": fwd_bwd("grouped"),
                    "loop_bwd": fwd_bwd("loop"),
                },
                repeats,
            )
            lines.append(
                f"  E {n_experts:2d} top-{k}: grouped {t['grouped'] * 1e3:7.1f} ms "
                f"[{t['grouped_bwd'] * 1e3:7.1f}]   loop {t['loop'] * 1e3:7.1f} ms "
                f"[{t['loop_bwd'] * 1e3:7.1f}]   loop/grouped {t['loop'] / t['grouped']:.2f}x "
                f"[{t['loop_bwd'] / t['grouped_bwd']:.2f}x]"
            )
    return lines


BENCHES: dict[str, Callable[[bool], list[str]]] = {
    "hooks": bench_hooks,
    "attention": bench_attention,
    "moe": bench_moe,
}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.model_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: stable ratios on a shared CPU)",
    )
    p.add_argument(
        "--only",
        choices=sorted(BENCHES),
        action="append",
        help="run only this benchmark (repeatable)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
        f"{', quick' if args.quick else ''}",
        flush=True,
    )
    for name in args.only or list(BENCHES):
        start = time.perf_counter()
        for line in BENCHES[name](args.quick):
            print(line, flush=True)
        print(f"  ({name}: {time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
