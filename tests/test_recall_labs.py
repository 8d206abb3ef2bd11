"""The recall labs. benchmarks.recall_idle_keys: each head's BOS and trigger-key mass at
non-answer positions, against a pure-Python loop over the same attention patterns, and uniform
attention's levels against a head whose queries are zero (its attention is exactly uniform),
and a model that hides the trigger keys (ModelConfig.hidden_key_ids) shows none on them from
the hiding layer on."""

from __future__ import annotations

import pytest
import torch

from benchmarks.recall_idle_keys import idle_masses
from smelt_interp.data.assoc_recall import FIRST_TRIGGER, recall_positions
from smelt_interp.data.tokenizer import BOS_ID
from smelt_interp.model.transformer import SmeltModel

T = FIRST_TRIGGER
a, b, c, d = (ord(x) for x in "abcd")
ROWS = torch.tensor(
    [
        [BOS_ID, a, T, b, c, T, b, d, a, T, b, c],
        [BOS_ID, c, d, T, a, b, T, a, T, a, d, d],
    ]
)


def loop_reference(patterns: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, tuple]:
    """The same means, query by query and key by key."""
    non_answer = recall_positions(rows, (T,)).non_answer.tolist()
    tokens = rows.tolist()
    out = {}
    for name, pattern in patterns.items():
        layer, visit = (int(x) for x in name.split(".")[1:4:2])
        for h in range(pattern.shape[1]):
            sums = [0.0, 0.0, 0.0, 0.0]
            n = 0
            for r, row in enumerate(tokens):
                for q in range(len(row)):
                    if not non_answer[r][q]:
                        continue
                    n += 1
                    sums[0] += float(pattern[r, h, q, 0])
                    sums[1] += sum(
                        float(pattern[r, h, q, k]) for k in range(1, q + 1) if row[k] == T
                    )
                    sums[2] += 1 / (q + 1)
                    sums[3] += sum(1 for k in range(1, q + 1) if row[k] == T) / (q + 1)
            out[f"{layer}.{visit}.{h}"] = tuple(s / n for s in sums)
    return out


def patterns_of(model, rows) -> dict[str, torch.Tensor]:
    got = {}
    names = model.hook_names("attn.hook_pattern")
    with torch.no_grad():
        model.run_with_hooks(
            rows,
            fwd_hooks=[(n, lambda p, hook: got.__setitem__(hook.name, p.double())) for n in names],
        )
    return got


def test_masses_equal_a_loop_over_the_patterns(tiny_model):
    got = idle_masses(tiny_model, ROWS, (T,))
    ref = loop_reference(patterns_of(tiny_model, ROWS), ROWS)
    assert set(got) == set(ref) and len(got) == 6 * 4  # every visit of the schedule, every head
    for key, values in ref.items():
        assert got[key] == pytest.approx(values, abs=1e-9), key


def test_a_head_with_zero_queries_reads_uniform_levels(tiny_model):
    for module in tiny_model.modules():
        if hasattr(module, "W_q"):
            torch.nn.init.zeros_(module.W_q.weight)
    for bos, trig, u_bos, u_trig in idle_masses(tiny_model, ROWS, (T,)).values():
        assert bos == pytest.approx(u_bos, abs=1e-6) and trig == pytest.approx(u_trig, abs=1e-6)
    # by hand: row 0's non-answer queries are 1, 3, 4, 6, 7, 8, 10 and its triggers sit at 2, 5, 9
    _, _, u_bos, u_trig = next(iter(idle_masses(tiny_model, ROWS[:1], (T,)).values()))
    assert u_bos == pytest.approx((1 / 2 + 1 / 4 + 1 / 5 + 1 / 7 + 1 / 8 + 1 / 9 + 1 / 11) / 7)
    assert u_trig == pytest.approx((0 + 1 / 4 + 1 / 5 + 2 / 7 + 2 / 8 + 2 / 9 + 3 / 11) / 7)


def test_hidden_trigger_keys_leave_later_layers_only(tiny_model):
    """The same weights with the trigger keys hidden from layers 1 and up: layer 0 is
    unchanged, later layers put nothing on the trigger keys, and layer 1's first visit (its
    input is layer 0's, unchanged) moves that mass onto the other keys, BOS among them."""
    before = idle_masses(tiny_model, ROWS, (T,))
    hiding = SmeltModel(tiny_model.cfg.replace(hidden_key_ids=(T,), hide_keys_from=1)).eval()
    hiding.load_state_dict(tiny_model.state_dict())
    after = idle_masses(hiding, ROWS, (T,))
    for key, (bos, trig, _, _) in after.items():
        old_bos, old_trig = before[key][:2]
        if key.startswith("0."):
            assert (bos, trig) == pytest.approx((old_bos, old_trig), abs=1e-6)
            continue
        assert trig == 0.0
        if key.startswith("1.0."):
            assert 0.0 < old_trig and bos > old_bos
