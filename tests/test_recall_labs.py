"""The recall labs. benchmarks.recall_idle_keys: each head's BOS and trigger-key mass at
non-answer positions, against a pure-Python loop over the same attention patterns, and uniform
attention's levels against a head whose queries are zero (its attention is exactly uniform).
benchmarks.recall_hidden_triggers: hiding keys equals the softmax with those keys at -inf, and
the installed hook hides the trigger keys from layers 1 and up only, and the lab refuses a
folder trained without that hiding."""

from __future__ import annotations

import pytest
import torch

from benchmarks.recall_idle_keys import idle_masses
from smelt_interp.data.assoc_recall import FIRST_TRIGGER, recall_positions
from smelt_interp.data.tokenizer import BOS_ID

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


def test_hiding_keys_is_the_softmax_without_them():
    from benchmarks.recall_hidden_triggers import hide_keys

    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 5, 5, generator=gen, dtype=torch.float64)
    hidden = torch.tensor([[False, True, False, True, False], [False, False, False, False, True]])
    ref = torch.softmax(scores.masked_fill(hidden[:, None, None, :], float("-inf")), dim=-1)
    assert torch.allclose(hide_keys(torch.softmax(scores, dim=-1), hidden), ref)


def test_installed_hiding_removes_trigger_keys_from_later_layers_only(tiny_model):
    from benchmarks.recall_hidden_triggers import install

    before = idle_masses(tiny_model, ROWS, (T,))
    install(tiny_model, (T,), from_layer=1)
    after = idle_masses(tiny_model, ROWS, (T,))  # run_with_hooks sees the hiding too
    for key, (bos, trig, _, _) in after.items():
        old_bos, old_trig = before[key][:2]
        if key.startswith("0."):
            assert (bos, trig) == pytest.approx((old_bos, old_trig), abs=1e-12)
            continue
        assert trig == 0.0
        if key.startswith("1.0."):  # its input is layer 0's, unchanged: per query, BOS / (1 - T)
            assert 0.0 < old_trig and bos > old_bos
    logits = tiny_model(ROWS)  # and so does a plain forward (training's path)
    assert torch.isfinite(logits).all()


def test_the_lab_refuses_a_folder_it_did_not_train_with_this_hiding(tmp_path):
    from benchmarks.recall_hidden_triggers import HIDING_FILE, check_hiding
    from smelt_interp.errors import RunFolderError

    hiding = {"trigger_ids": [T], "from_layer": 1}
    check_hiding(tmp_path / "new", hiding)  # nothing there yet: fine
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(RunFolderError, match="did not train"):
        check_hiding(run, hiding)
    (run / HIDING_FILE).write_text('{"trigger_ids": [16], "from_layer": 2}\n')
    with pytest.raises(RunFolderError, match="trained hiding"):
        check_hiding(run, hiding)
    (run / HIDING_FILE).write_text("{not json")
    with pytest.raises(RunFolderError, match="not this lab's record"):
        check_hiding(run, hiding)
    (run / HIDING_FILE).write_text('{"trigger_ids": [16], "from_layer": 1}\n')
    check_hiding(run, hiding)
