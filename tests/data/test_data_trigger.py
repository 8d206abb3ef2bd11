"""Trigger-task rows, one-document-per-row corpus rows, and per-domain row lengths."""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter

import pytest
import torch

from smelt_interp.data.documents import Document
from smelt_interp.data.packing import document_rows
from smelt_interp.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from smelt_interp.data.trigger import (
    FILLER,
    SKIP,
    TRIGGERS,
    TriggerSpec,
    answer_positions,
    bigram_table,
    trigger_rows,
)
from smelt_interp.errors import ConfigError, DataError
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.data import TrainingData


def test_trigger_rows_are_deterministic_bos_led_and_split_apart():
    a = trigger_rows(8, 64, seed=3)
    assert a.shape == (8, 64)
    assert torch.equal(a, trigger_rows(8, 64, seed=3))
    assert (a[:, 0] == BOS_ID).all()
    assert not torch.equal(a, trigger_rows(8, 64, seed=3, split="heldout"))


def test_every_answer_is_the_copy_its_trigger_asks_for():
    rows = trigger_rows(64, 128, seed=0, spec=TriggerSpec(rate=0.2))
    seen = {kind: 0 for kind in TRIGGERS}
    for row in rows.tolist():
        recalled = None
        for p in range(1, len(row) - 1):
            if row[p] == ord(TRIGGERS["backcopy"]):
                assert row[p + 1] == row[p - 1]
                seen["backcopy"] += 1
            elif row[p] == ord(TRIGGERS["skipcopy"]):
                assert row[p + 1] == row[p - SKIP]
                seen["skipcopy"] += 1
            elif row[p] == ord(TRIGGERS["recall"]):
                if recalled is not None:
                    assert row[p + 1] == recalled
                    seen["recall"] += 1
                recalled = row[p + 1]
    assert min(seen.values()) > 50
    assert answer_positions(rows).float().mean() > 0.05


def test_trigger_spec_rejects_bad_fields():
    with pytest.raises(DataError):
        TriggerSpec(rate=0.0)
    with pytest.raises(DataError):
        TriggerSpec(kinds=("nope",))


def test_document_rows_hold_one_document_each():
    docs = [Document(f"d{i}", "text", f"line {i}\n" * (i + 1)) for i in range(4)]
    rows = document_rows(docs, 32, 24, random.Random(0))
    assert (rows[:, 0] == BOS_ID).all()
    for row in rows.tolist():
        body = [t for t in row[1:] if t != PAD_ID]
        assert EOS_ID not in body[:-1]  # at most one document end, and only last
        text = bytes(t for t in body if t < 256).decode()
        assert len({ch for ch in text if ch.isdigit()}) <= 1  # one document's lines only


def test_row_len_blends_every_domain_at_its_own_length():
    cfg = TrainConfig.from_dict(
        dict(
            data={"dyck": 0.5, "trigger": 0.5},
            row_len={"trigger": 32},
            seq_len=64,
            batch_size=4,
            dyck={"n_pairs": 2, "max_depth": 3, "min_len": 2, "max_len": 8},
        )
    )
    data = TrainingData(cfg)
    parts = data.batch_parts(3)
    assert [tuple(p.shape) for p in parts] == [(2, 64), (4, 32)]
    assert all(torch.equal(a, b) for a, b in zip(parts, data.batch_parts(3)))
    assert data.heldout("trigger", 3).shape == (3, 32)
    with pytest.raises(DataError):
        data.batch_at(3)


def test_without_row_len_a_batch_is_one_part():
    cfg = TrainConfig.from_dict(
        dict(
            data={"dyck": 1.0},
            seq_len=32,
            batch_size=2,
            dyck={"n_pairs": 2, "max_depth": 3, "min_len": 2, "max_len": 8},
        )
    )
    data = TrainingData(cfg)
    (part,) = data.batch_parts(5)
    assert torch.equal(part, data.batch_at(5))


def test_row_len_must_be_a_length():
    with pytest.raises(ConfigError):
        TrainConfig.from_dict({"row_len": {"trigger": 1}})


def two_length_run(**over) -> TrainConfig:
    """A tiny two-layer model on Dyck rows of 64 tokens and trigger rows of 32."""
    fields = dict(
        model={
            "d_model": 32,
            "n_layers": 2,
            "n_heads": 2,
            "n_kv_heads": 1,
            "d_head": 16,
            "n_experts": 2,
            "top_k": 1,
            "d_expert": 32,
        },
        data={"dyck": 0.5, "trigger": 0.5},
        row_len={"trigger": 32},
        dyck={"n_pairs": 2, "max_depth": 3, "min_len": 2, "max_len": 8},
        trigger={"rate": 0.2},
        seq_len=64,
        batch_size=4,
        steps=4,
        warmup_steps=1,
        eval_every=4,
        ckpt_every=4,
        dyck_eval_n=4,
        eval_rows=2,
        threads=1,
    )
    return TrainConfig.from_dict({**fields, **over})


def test_trainer_steps_on_parts_of_several_row_lengths(tmp_path):
    from smelt_interp.train.trainer import Trainer

    result = Trainer(two_length_run(), tmp_path, progress=False).run()
    assert result.tokens == 4 * 64 * 4
    assert math.isfinite(result.final_eval["loss/trigger"])
    assert math.isfinite(result.final_eval["loss/dyck"])


def test_a_step_over_parts_equals_one_pass_over_the_parts_padded_to_one_length(tmp_path):
    """Reference: every part right-padded with PAD to the longest row and stacked into one
    batch, one forward pass, the token-mean loss. The trainer's step (a forward pass per row
    length, each loss weighted by its share of targets) must give the same loss and gradients
    (auxiliary losses off: they are per pass by design; clipping off: grads seen before it)."""
    from smelt_interp.train.evaluate import lm_loss
    from smelt_interp.train.trainer import Trainer

    cfg = two_length_run(
        data={"dyck": 0.8, "trigger": 0.2}, load_balance_coef=0.0, z_loss_coef=0.0, grad_clip=1e9
    )
    trainer = Trainer(cfg, tmp_path, progress=False)
    parts = trainer.data.batch_parts(0)
    assert len({p.shape[1] for p in parts}) == 2
    width = max(p.shape[1] for p in parts)
    batch = torch.cat(
        [torch.nn.functional.pad(p, (0, width - p.shape[1]), value=PAD_ID) for p in parts]
    )
    trainer.model.zero_grad(set_to_none=True)
    expected = lm_loss(trainer.model(batch), batch)
    expected.backward()
    expected_grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
    trainer.model.zero_grad(set_to_none=True)

    seen: dict[str, torch.Tensor] = {}

    def keep_grads(*_):
        seen.update({n: p.grad.clone() for n, p in trainer.model.named_parameters()})

    trainer.optimizer.register_step_pre_hook(keep_grads)
    stats = trainer.train_step(lr=0.0)
    assert seen.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(seen[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert stats["loss"] == pytest.approx(expected.item(), rel=1e-6)


def test_sink_pair_preset_blends_dyck_trigger_and_code_rows():
    from smelt_interp.train.presets import get_preset

    cfg = TrainConfig.from_dict(get_preset("sink-pair"))
    parts = TrainingData(cfg).batch_parts(0)
    assert [tuple(p.shape) for p in parts] == [(11, 320), (16, 64), (8, 64)]
    assert all((p[:, 0] == BOS_ID).all() for p in parts)


# sha256 of repr(rows.tolist()) for trigger_rows(8, 64, seed=0), train then held-out, computed on
# the code before the bigram filler existed: the default (uniform) rows must not change.
UNIFORM_ROWS_SHA = "2a501e3559299778838bbd158a8571e5c9b0b038997c5835ded44d509b2f135d"


def test_uniform_filler_rows_are_unchanged_by_the_bigram_option():
    rows = (
        trigger_rows(8, 64, seed=0).tolist() + trigger_rows(8, 64, seed=0, split="heldout").tolist()
    )
    assert hashlib.sha256(repr(rows).encode()).hexdigest() == UNIFORM_ROWS_SHA
    assert torch.equal(
        trigger_rows(4, 64, seed=5), trigger_rows(4, 64, seed=5, spec=TriggerSpec(filler="uniform"))
    )


def test_bigram_rows_are_a_pure_function_of_seed_and_split():
    spec = TriggerSpec(filler="bigram")
    a = trigger_rows(8, 64, seed=3, spec=spec)
    table = bigram_table(len(FILLER))
    bigram_table.cache_clear()
    assert bigram_table(len(FILLER)) == table  # the table is rebuilt identically, not state
    assert torch.equal(a, trigger_rows(8, 64, seed=3, spec=spec))
    assert (a[:, 0] == BOS_ID).all()
    assert not torch.equal(a, trigger_rows(8, 64, seed=4, spec=spec))
    assert not torch.equal(a, trigger_rows(8, 64, seed=3, split="heldout", spec=spec))
    assert not torch.equal(a, trigger_rows(8, 64, seed=3))


def _filler_transitions(rows: torch.Tensor) -> list[tuple[int, int]]:
    """(previous, next) byte pairs where both are filler: next is neither a trigger nor the
    answer that follows one, and previous is not BOS."""
    codes = {ord(c) for c in TRIGGERS.values()}
    pairs = []
    for row in rows.tolist():
        for p in range(1, len(row) - 1):
            if row[p] not in codes and row[p + 1] not in codes:
                pairs.append((row[p], row[p + 1]))
    return pairs


def test_bigram_filler_follows_the_table_and_answers_stay_copies():
    spec = TriggerSpec(rate=0.2, filler="bigram")
    rows = trigger_rows(64, 128, seed=0, spec=spec)
    table = bigram_table(len(FILLER))
    letters = {ord(c) for c in FILLER}
    assert set(table) == letters
    assert all(2 <= len(succ) <= 4 and set(succ) <= letters for succ, _ in table.values())
    pairs = _filler_transitions(rows)
    assert len(pairs) > 4000
    assert all(b in table[a][0] for a, b in pairs)
    # empirical successor frequencies match the table's weights (total variation < 0.1 on bytes
    # seen >= 150 times); the same check on uniform rows fails
    for name, check_rows in (("bigram", rows), ("uniform", trigger_rows(64, 128, seed=0))):
        counts = Counter(_filler_transitions(check_rows))
        by_prev = Counter(a for a, _ in _filler_transitions(check_rows))
        tvs = []
        for a, n in by_prev.items():
            if n < 150:
                continue
            succ, cum = table[a]
            probs = dict(zip(succ, [c - p for c, p in zip(cum, (0.0, *cum[:-1]))]))
            nexts = {b for (x, b) in counts if x == a} | set(succ)
            tvs.append(sum(abs(counts[(a, b)] / n - probs.get(b, 0.0)) for b in nexts) / 2)
        if name == "bigram":
            assert tvs and max(tvs) < 0.1, tvs
        else:
            in_table = sum(b in table[a][0] for a, b in _filler_transitions(check_rows))
            assert in_table / len(_filler_transitions(check_rows)) < 0.1
    # the copies are unchanged by the filler
    for row in rows.tolist():
        for p in range(SKIP + 1, len(row) - 1):
            if row[p] == ord(TRIGGERS["backcopy"]):
                assert row[p + 1] == row[p - 1]
            elif row[p] == ord(TRIGGERS["skipcopy"]):
                assert row[p + 1] == row[p - SKIP]


def test_filler_must_be_a_known_kind():
    with pytest.raises(DataError):
        TriggerSpec(filler="zipf")
    with pytest.raises(ConfigError):
        TrainConfig.from_dict({"data": {"trigger": 1.0}, "trigger": {"filler": "zipf"}})
    with pytest.raises(ConfigError):
        TrainConfig.from_dict({"data": {"trigger": 1.0}, "trigger": {"filler": 3}})
    assert TrainConfig.from_dict(
        {"data": {"trigger": 1.0}, "trigger": {"filler": "bigram"}}
    ).corpus.trigger
