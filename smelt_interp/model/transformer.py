"""The SMELT/Baseline transformer as a TransformerLens HookedRootModule.

Execution follows `cfg.schedule`; every (layer, visit) owns its hook points, so no hook point
fires twice in one forward pass and `run_with_cache` / nnsight see each visit separately."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from smelt_interp.config import ModelConfig
from smelt_interp.errors import TokenError
from smelt_interp.model.block import Block, make_norm, visit_compute
from smelt_interp.model.kv_cache import KVCache
from smelt_interp.model.protocol import VisitNaming
from smelt_interp.model.rope import Rotary


def next_token_ce(
    logits: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Cross-entropy [batch, pos - 1] of predicting tokens[:, i + 1] from logits[:, i], in
    float32 (float64 logits stay float64), 0 where the target is not `valid` (a [batch, pos]
    mask over `tokens`; default: every target counts). The loss every measure shares."""
    targets = tokens[:, 1:]
    if valid is not None:
        targets = targets.masked_fill(~valid[:, 1:], -100)  # cross_entropy's ignore_index
    dtype = torch.promote_types(logits.dtype, torch.float32)
    flat = logits[:, :-1].reshape(-1, logits.shape[-1]).to(dtype)
    return F.cross_entropy(flat, targets.reshape(-1), reduction="none").view(targets.shape)


class SmeltModel(VisitNaming, HookedRootModule):
    """Byte-level pre-norm MoE transformer with an optional looped span (untied unembedding)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.hook_embed = HookPoint()
        # only for positions="learned": a rope model has no such parameter (checkpoints unchanged)
        self.pos_embed = (
            nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.positions == "learned" else None
        )
        self.rotary = Rotary(cfg.d_head, cfg.max_seq_len, cfg.rope_theta)
        # not persistent: the ids follow the config, and checkpoints keep their keys
        ids = torch.tensor(cfg.hidden_key_ids, dtype=torch.long)
        self.register_buffer("hidden_key_ids", ids, persistent=False)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layers))
        self.ln_final = make_norm(cfg)
        self.hook_resid_final = HookPoint()
        self.unembed = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.aux_losses: dict[str, torch.Tensor] = {}
        self._init_weights()
        self.setup()

    def _init_weights(self) -> None:
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.effective_depth)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):  # LayerNorm's
                nn.init.zeros_(p)
            elif p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith(("W_o.weight", "W_down")):
                nn.init.normal_(p, std=out_std)
            else:
                nn.init.normal_(p, std=std)

    # ----- forward -----------------------------------------------------------------
    def forward(
        self, tokens: torch.Tensor, cache: KVCache | None = None, *, ids_checked: bool = False
    ) -> torch.Tensor:
        """tokens [batch, pos] -> logits [batch, pos, vocab]; router losses in `self.aux_losses`
        (`ids_checked`: see check_tokens)."""
        past = cache.seq_len if cache is not None else 0
        tokens = self.check_tokens(tokens, past, ids_checked)
        tokens = tokens.to(self.embed.weight.device)
        x = self.embed(tokens)
        if self.pos_embed is not None:
            x = x + self.pos_embed(torch.arange(past, past + tokens.shape[1], device=x.device))
        x = self.hook_embed(x)
        rope = self.rotary.tables(past, tokens.shape[1])  # sliced once, shared by every visit
        hidden = self.key_mask(tokens, past)
        if hidden is not None and cache is not None:
            hidden = cache.extend_hidden(hidden)
        balance, z_loss = [], []
        for layer, visit in self.schedule:
            x, losses = self.blocks[layer](x, visit, rope, cache, hidden)
            balance.append(losses.load_balance)
            z_loss.append(losses.z_loss)
        self.aux_losses = {
            "load_balance": torch.stack(balance).mean(),
            "z_loss": torch.stack(z_loss).mean(),
        }
        x = self.hook_resid_final(self.ln_final(x))
        return self.unembed(x)

    def unembed_resid(self, resid: torch.Tensor) -> torch.Tensor:
        """Logits read off a residual stream [.., d_model] as if it were the last layer's: the
        final norm, then the unembedding (the logit lens, model.protocol.LoopedModel)."""
        return self.unembed(self.ln_final(resid))

    def key_mask(self, tokens: torch.Tensor, past: int = 0) -> torch.Tensor | None:
        """[batch, pos] True at the tokens whose keys the layers that hide keys cannot see
        (ModelConfig.hidden_key_ids), for tokens at positions past.. ; None when the model
        hides none. Position 0 is never hidden, so every query keeps a key to attend to."""
        if not self.cfg.hidden_key_ids:
            return None
        hidden = torch.isin(tokens, self.hidden_key_ids.to(tokens.device))
        if past == 0:
            hidden[:, 0] = False
        return hidden

    def hidden_keys(self, tokens: torch.Tensor) -> dict[int, torch.Tensor]:
        """For each layer that hides keys, its [batch, pos] mask of hidden keys over whole rows
        `tokens`: what a measure that recomputes attention from cached Q and K must apply to
        match the model's own (empty when the model hides none)."""
        hidden = self.key_mask(self.check_tokens(tokens))
        if hidden is None:
            return {}
        return {layer: hidden for layer in range(self.cfg.n_layers) if self.cfg.hides_keys(layer)}

    # ----- switches ----------------------------------------------------------------
    @contextlib.contextmanager
    def explicit_attention(self, visits: list[tuple[int, int]] | None = None) -> Iterator[None]:
        """Force the pattern-materialising path (all visits, or the given ones)."""
        chosen = list(self.schedule) if visits is None else visits
        hooks = [self.blocks[layer].visits[visit].attn for layer, visit in chosen]
        for h in hooks:
            h.force_pattern = True
        try:
            yield
        finally:
            for h in hooks:
                h.force_pattern = False

    def compile_blocks(self, **options: Any) -> None:
        """Run every Block's training visits through one compiled function (see
        block.compiled_visit): one graph for every layer and visit, a graph per row length
        (`dynamic=False`), so alternating lengths never recompile once each has been seen.
        `options` go to torch.compile (e.g. backend="aot_eager" in tests)."""
        compiled = torch.compile(visit_compute, dynamic=False, **options)
        for block in self.blocks:
            block.compiled = compiled

    def set_dispatch(self, dispatch: str) -> None:
        """'grouped' (default, grouped_mm) or 'loop' (the per-expert reference)."""
        if dispatch not in ("grouped", "loop"):
            raise ValueError(f"dispatch must be 'grouped' or 'loop', got {dispatch!r}")
        for block in self.blocks:
            block.moe.dispatch = dispatch

    # ----- decoding ----------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        tokens: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Extend equal-length rows by max_new_tokens (greedy when temperature is 0).

        With use_cache the KV cache holds one entry per (layer, visit); without it every step
        recomputes the whole prefix (the reference the cache is tested against)."""
        tokens = self.check_tokens(tokens).to(self.embed.weight.device)
        if tokens.shape[1] + max_new_tokens > self.cfg.max_seq_len:
            raise TokenError(
                f"prompt of {tokens.shape[1]} tokens plus {max_new_tokens} new "
                f"exceeds max_seq_len {self.cfg.max_seq_len}"
            )
        cache = KVCache() if use_cache else None
        step_input, out = tokens, tokens
        for _ in range(max_new_tokens):
            logits = self(step_input, cache=cache)[:, -1].float()
            if temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            else:
                nxt = logits.argmax(dim=-1, keepdim=True)
            out = torch.cat([out, nxt], dim=1)
            step_input = nxt if use_cache else out
        return out
