"""A hand-built looped model with the protocol's per-visit hook points, whose circuit is known:
one visit's head reads the tokens and writes the answer, everything else writes into a junk
subspace the unembedding never reads.

The residual stream has four blocks of `vocab` dimensions: S1 holds the token (one-hot), S2 a
relay, S3 the answer the unembedding reads (logits = S3), S4 junk. Schedule (0,0), (1,0),
(1,1), (2,0): layer 1 runs twice with its own weights per visit (as a hand-built model may).
Heads attend causally with scores from q . k, both read off S1; `uniform` sets every W_q and
W_k to zero, so every pattern is uniform and the whole model is linear in every activation.
The answer head is (1, 1, 0): it copies S1 (or, with `relay`, S2, written by (1, 0, 0) from
S1) into S3. Every other head and every MLP (a ReLU of S1) writes only S4; with `mlp_answer`
the last MLP also copies S2 into S3 on a linear path."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from smelt_interp.model.protocol import VisitNaming, validate_tokens

SCHEDULE = ((0, 0), (1, 0), (1, 1), (2, 0))
ANSWER = (1, 1, 0)
RELAY = (1, 0, 0)


class Hooks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.attn = nn.Module()
        for name in ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z"):
            setattr(self.attn, name, HookPoint())
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()


class Block(nn.Module):
    def __init__(self, n_visits: int) -> None:
        super().__init__()
        self.visits = nn.ModuleList(Hooks() for _ in range(n_visits))


def _shape(vocab: int, n_heads: int) -> SimpleNamespace:
    return SimpleNamespace(
        name="hand-built", vocab_size=vocab, d_model=4 * vocab, n_layers=3, n_heads=n_heads,
        n_kv_heads=n_heads, d_head=vocab, n_group=1, max_seq_len=32, schedule=SCHEDULE,
        is_looped=True, looped_layers=(1,), first_token_id=None,
        visits_of=lambda layer: 2 if layer == 1 else 1,
    )  # fmt: skip


class HandBuilt(VisitNaming, HookedRootModule):
    """The model of the module docstring; tokens [b, T] of ids below `vocab`."""

    def __init__(
        self,
        vocab: int = 6,
        n_heads: int = 2,
        uniform: bool = True,
        relay: bool = False,
        mlp_answer: bool = False,
    ) -> None:
        super().__init__()
        self.cfg = _shape(vocab, n_heads)
        self.blocks = nn.ModuleList(Block(self.cfg.visits_of(n)) for n in range(3))
        gen = torch.Generator().manual_seed(0)
        d, dh, v = 4 * vocab, vocab, vocab
        self.w = nn.ParameterDict()
        for layer, visit in SCHEDULE:
            key = f"{layer}_{visit}"
            for name in ("q", "k"):  # scores read S1 only, so junk moves no pattern
                w_qk = torch.zeros(n_heads, d, dh)
                if not uniform:
                    w_qk[:, :v] = torch.randn(n_heads, v, dh, generator=gen)
                self.w[f"{name}{key}"] = nn.Parameter(w_qk)
            w_v = torch.zeros(n_heads, d, dh)
            w_v[:, :v] = torch.randn(n_heads, v, dh, generator=gen)  # every head reads S1
            w_o = torch.zeros(n_heads, dh, d)
            w_o[:, :, 3 * v :] = torch.randn(n_heads, dh, v, generator=gen)  # junk into S4
            self.w[f"v{key}"], self.w[f"o{key}"] = nn.Parameter(w_v), nn.Parameter(w_o)
            w_m = torch.zeros(d, d)
            w_m[:v, 3 * v :] = torch.randn(v, v, generator=gen)
            self.w[f"m{key}"] = nn.Parameter(w_m)
            self.w[f"l{key}"] = nn.Parameter(torch.zeros(d, d))  # a linear path beside the ReLU
        eye = torch.eye(v)
        answer, relay_key = "1_1", "1_0"
        with torch.no_grad():
            w_v, w_o = self.w[f"v{answer}"], self.w[f"o{answer}"]
            w_v[0].zero_()
            w_v[0, v : 2 * v] = eye if relay else 0
            w_v[0, :v] = 0 if relay else eye
            w_o[0].zero_()
            w_o[0, :, 2 * v : 3 * v] = eye
            if mlp_answer:  # the last MLP copies the relay into S3 as well
                self.w["l2_0"][v : 2 * v, 2 * v : 3 * v] = eye
            if relay:
                self.w[f"o{relay_key}"][0].zero_()
                self.w[f"o{relay_key}"][0, :, v : 2 * v] = eye
                self.w[f"v{relay_key}"][0].zero_()
                self.w[f"v{relay_key}"][0, :v] = eye
        self.setup()

    def check_tokens(self, tokens, past=0, ids_checked=False):
        return validate_tokens(tokens, self.cfg, past, ids_checked)

    def hidden_keys(self, tokens):
        return {}

    def unembed_resid(self, resid):
        v = self.cfg.vocab_size
        return resid[..., 2 * v : 3 * v]

    def _visit(self, x: torch.Tensor, layer: int, visit: int) -> torch.Tensor:
        hooks, key = self.blocks[layer].visits[visit], f"{layer}_{visit}"
        x = hooks.hook_resid_pre(x)
        q = hooks.attn.hook_q(torch.einsum("btd,hde->bthe", x, self.w[f"q{key}"]))
        k = hooks.attn.hook_k(torch.einsum("btd,hde->bthe", x, self.w[f"k{key}"]))
        val = hooks.attn.hook_v(torch.einsum("btd,hde->bthe", x, self.w[f"v{key}"]))
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(q.shape[-1])
        t = x.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        pattern = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        pattern = hooks.attn.hook_pattern(pattern)
        z = hooks.attn.hook_z(torch.einsum("bhqk,bkhe->bqhe", pattern, val))
        x = hooks.hook_resid_mid(
            x + hooks.hook_attn_out(torch.einsum("bthe,hed->btd", z, self.w[f"o{key}"]))
        )
        mlp = torch.relu(x) @ self.w[f"m{key}"] + x @ self.w[f"l{key}"]
        mlp = hooks.hook_mlp_out(mlp)
        return hooks.hook_resid_post(x + mlp)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = self.check_tokens(tokens)
        v = self.cfg.vocab_size
        x = torch.zeros(*tokens.shape, 4 * v)
        x[..., :v] = torch.nn.functional.one_hot(tokens, v).float()
        for layer, visit in SCHEDULE:
            x = self._visit(x, layer, visit)
        return self.unembed_resid(x)
