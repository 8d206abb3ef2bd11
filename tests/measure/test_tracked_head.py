"""The tracked head (measure.head_choice) and the probe that reports it (probes.computed_recall):
every candidate's accuracy after its visit-1 mean ablation equals a slow reference (the mean of
visit 0's z in a plain float64 loop, the edit a plain forward hook, accuracy counted position by
position); the choice reads the validation rows only (the table does not move with the test
rows, and the probe draws its choice from the validation namespace and its masses from the test
one); a head planted as the only one accuracy rests on is chosen."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from conftest import TINY_FIELDS
from helpers.hand_built import HandBuilt

from smelt_interp.config import ModelConfig
from smelt_interp.data.computed_recall import ARROW, ComputedRecallSpec, computed_positions
from smelt_interp.data.computed_recall import computed_rows as draw_rows
from smelt_interp.data.tokenizer import PAD_ID
from smelt_interp.measure.computed_case import answer_head_masses, computed_case
from smelt_interp.measure.head_choice import (
    NO_DROP_NOTE,
    SINGLE_VISIT_NOTE,
    candidates,
    choose_head,
    mean_z,
)
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes import computed_inputs, computed_recall
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import ProbeOptions

SPEC = ComputedRecallSpec()
SPEC_PLANTED = ComputedRecallSpec(n_classes=2)  # two labels: the most frequent one is often right
N_ROWS, LENGTH = 8, 60  # 9 demonstrations and the query fill 60 tokens: no PAD


def label_readout(model: SmeltModel, spec: ComputedRecallSpec) -> SmeltModel:
    """`model` (LayerNorm) made to answer with a label always: the final norm's bias puts 50 on
    one axis that every label's unembedding row reads with +1 and every other row with -1, the
    labels' other weights random. Greedy accuracy at answer positions is then near chance
    (1 / n_classes) and moves when a head's write moves, so ablations give different counts."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model.ln_final.bias.zero_()
        model.ln_final.bias[0] = 50.0
        w = model.unembed.weight
        w.zero_()
        w[:, 0] = -1.0
        for label in spec.label_ids:
            w[label] = torch.randn(w.shape[1], generator=gen)
            w[label, 0] = 1.0
    return model


def readout_model(looped: bool = True) -> SmeltModel:
    make = ModelConfig.smelt if looped else ModelConfig.baseline
    torch.manual_seed(0)
    cfg = make(**(TINY_FIELDS | {"norm": "layer", "init_std": 0.3}))
    return label_readout(SmeltModel(cfg).eval(), SPEC)


def slow_choice(model, rows: torch.Tensor, spec: ComputedRecallSpec) -> pd.DataFrame:
    """The reference: per candidate (layer, head), the mean of its visit-0 z over the rows'
    non-PAD positions in a plain float64 loop, that mean written over its z at the ablated visit
    by a forward hook on the hook point, and the greedy hits counted position by position."""
    positions = computed_positions(rows, spec)
    schedule = list(model.schedule)
    visit = 1 if any(v == 1 for _, v in schedule) else 0
    layers = sorted({layer for layer, v in schedule if v == visit})
    n_heads = model.cfg.n_heads

    def accuracy(edit=None) -> float:
        handle = None
        if edit is not None:
            layer, head, mean = edit

            def hook(_module, _args, out):
                out = out.clone()
                out[:, :, head] = mean.to(out.dtype)
                return out

            handle = model.blocks[layer].visits[visit].attn.hook_z.register_forward_hook(hook)
        try:
            with torch.no_grad():
                logits = model(rows)
        finally:
            if handle is not None:
                handle.remove()
        hits = total = 0
        for r in range(rows.shape[0]):
            for t in range(rows.shape[1]):
                if positions.answer[r, t]:
                    total += 1
                    hits += int(logits[r, t].argmax()) == int(positions.targets[r, t])
        return hits / total

    before = accuracy()
    records = []
    for layer in layers:
        seen = []
        point = model.blocks[layer].visits[0].attn.hook_z
        handle = point.register_forward_hook(lambda _m, _a, out: seen.append(out.detach()))
        with torch.no_grad():
            model(rows)
        handle.remove()
        z = seen[0]
        for head in range(n_heads):
            total = torch.zeros(z.shape[-1], dtype=torch.float64)
            count = 0
            for r in range(rows.shape[0]):
                for t in range(rows.shape[1]):
                    if rows[r, : t + 1].ne(PAD_ID).all():
                        total += z[r, t, head].double()
                        count += 1
            after = accuracy((layer, head, total / count))
            records.append((layer, visit, head, before, after, before - after))
    return pd.DataFrame(
        records, columns=["layer", "visit", "head", "accuracy_before", "accuracy_after", "drop"]
    )


def planted_model(n_heads: int = 3, planted: int = 2) -> HandBuilt:
    """tests/helpers/hand_built.py's model (per-visit weights; the unembedding reads only what
    head (1, 1, 0) writes, every other head writes junk) with its answer head moved to head
    `planted` of visit 1 and aimed: at `=` it attends to the rows' label tokens and copies them,
    so it answers with the most frequent earlier label. Every other head of visit 1 writes only
    junk, so this one head is all the accuracy rests on."""
    model = HandBuilt(vocab=PAD_ID + 2, n_heads=n_heads, uniform=True)
    with torch.no_grad():
        for name in ("q", "k", "v", "o"):
            w = model.w[f"{name}1_1"]
            w[[0, planted]] = w[[planted, 0]].clone()
        model.w["q1_1"][planted, ARROW, 0] = 20.0
        for label in SPEC_PLANTED.label_ids:
            model.w["k1_1"][planted, label, 0] = 20.0
    return model


@pytest.fixture(scope="module")
def rows() -> torch.Tensor:
    return draw_rows(N_ROWS, LENGTH, "validation:0", split="heldout", spec=SPEC)


def test_every_candidates_accuracy_equals_a_slow_reference(rows):
    model = readout_model()
    choice = choose_head(model, rows, SPEC, batch_size=N_ROWS)
    want = slow_choice(model, rows, SPEC)
    pd.testing.assert_frame_equal(choice.table, want, check_exact=True)
    assert (choice.table["visit"] == 1).all()
    assert sorted(choice.table["layer"].unique()) == list(model.cfg.looped_layers)
    assert choice.table["accuracy_after"].nunique() > 1  # the ablations do move accuracy
    best = want.loc[want["drop"].idxmax()]
    assert (choice.layer, choice.head) == (best["layer"], best["head"])
    assert choice.visit == 1
    assert choice.table.loc[choice.table["drop"].idxmax(), "drop"] == best["drop"]
    assert choice.note == ("" if best["drop"] > 0 else NO_DROP_NOTE)


def test_a_baseline_ablates_every_head_at_its_only_visit(rows):
    model = readout_model(looped=False)
    assert candidates(model) == (0, [0, 1, 2, 3], SINGLE_VISIT_NOTE)
    choice = choose_head(model, rows[:4], SPEC, batch_size=4)
    pd.testing.assert_frame_equal(choice.table, slow_choice(model, rows[:4], SPEC))
    assert choice.visit == 0 and choice.note.startswith(SINGLE_VISIT_NOTE)


def test_the_mean_leaves_out_padding(make_model, tiny_cfg):
    model = make_model(tiny_cfg)
    padded = draw_rows(3, 64, 1, split="heldout", spec=SPEC)  # 60 tokens, then 4 PAD
    assert (padded[:, 60:] == PAD_ID).all() and (padded[:, :60] != PAD_ID).all()
    seen = []
    point = model.blocks[1].visits[0].attn.hook_z
    handle = point.register_forward_hook(lambda _m, _a, out: seen.append(out.detach()))
    with torch.no_grad():
        model(padded)
    handle.remove()
    got = mean_z(model, padded, [1])[1]
    # float32 z of a 64- and a 60-wide pass differ in the last bits; PAD would move it far more
    torch.testing.assert_close(got, seen[0][:, :60].double().mean(dim=(0, 1)), rtol=1e-5, atol=1e-8)
    with_pad = seen[0].double().mean(dim=(0, 1))
    assert not torch.allclose(got, with_pad, rtol=1e-3, atol=1e-6)


def test_the_planted_head_is_chosen():
    model = planted_model(n_heads=3, planted=2)
    rows = draw_rows(N_ROWS, 30, "validation:0", split="heldout", spec=SPEC_PLANTED)
    choice = choose_head(model, rows, SPEC_PLANTED)
    assert (choice.layer, choice.head, choice.visit, choice.note) == (1, 2, 1, "")
    table = choice.table.set_index("head")
    assert table.loc[2, "drop"] > 0.3  # the answers rest on it
    assert (table.loc[[0, 1], "drop"] == 0).all()  # junk writers: nothing moves
    pd.testing.assert_frame_equal(choice.table, slow_choice(model, rows, SPEC_PLANTED))


def test_the_choice_does_not_move_with_the_test_rows(rows):
    model = readout_model()
    tests = [draw_rows(4, LENGTH, f"test:{seed}", split="heldout", spec=SPEC) for seed in (0, 1)]
    first, second = (computed_recall.tracked_head(model, rows, t, SPEC) for t in tests)
    pd.testing.assert_frame_equal(first["ablation"], second["ablation"], check_exact=True)
    assert first["ablation"]["chosen"].sum() == 1
    assert not first["masses"][["bos_mass", "demo_mass"]].equals(
        second["masses"][["bos_mass", "demo_mass"]]
    )  # the masses are the test rows'
    chosen = first["ablation"][first["ablation"]["chosen"]].iloc[0]
    masses = answer_head_masses(model, tests[0], SPEC).frame()
    want = masses[(masses["layer"] == chosen["layer"]) & (masses["head"] == chosen["head"])]
    assert list(first["masses"]["visit"]) == [0, 1]
    assert list(first["masses"]["bos_mass"]) == list(want["bos_mass"])
    assert list(first["masses"]["demo_mass"]) == list(want["demo_mass"])


def test_the_probe_chooses_on_validation_rows_and_measures_on_test_rows(monkeypatch):
    model = readout_model()
    drawn: list[tuple[str, torch.Tensor]] = []
    chose_on: list[torch.Tensor] = []
    measured_on: list[torch.Tensor] = []

    def spy_rows(n_rows, length, seed, *, split, spec):
        out = draw_rows(n_rows, length, seed, split=split, spec=spec)
        assert split == "heldout" and spec == SPEC
        drawn.append((seed, out))
        return out

    def spy_choose(model, rows, spec, **kw):
        chose_on.append(rows)
        return choose_head(model, rows, spec, **kw)

    def spy_masses(model, rows, spec, **kw):
        measured_on.append(rows)
        return answer_head_masses(model, rows, spec, **kw)

    monkeypatch.setattr(computed_inputs, "computed_rows", spy_rows)
    monkeypatch.setattr(computed_recall, "choose_head", spy_choose)
    monkeypatch.setattr(computed_recall, "answer_head_masses", spy_masses)
    inputs = ProbeInputs(n_seqs=4, seed=7)
    tables = computed_recall.run(model, inputs, ProbeOptions())
    assert [seed for seed, _ in drawn] == ["validation:7", "test:7"]
    assert len(chose_on) == 1 and torch.equal(chose_on[0], drawn[0][1])
    assert len(measured_on) == 1 and torch.equal(measured_on[0], drawn[1][1])
    assert not torch.equal(drawn[0][1], drawn[1][1])
    assert drawn[0][1].shape == (4, 64)  # the default 66 cut to the model's context
    summary = computed_recall.summarize(tables).set_index("statistic")["value"]
    chosen = tables["ablation"][tables["ablation"]["chosen"]].iloc[0]
    assert summary["tracked head: layer"] == chosen["layer"]
    assert summary["tracked head: head"] == chosen["head"]
    for visit in (0, 1):
        row = tables["masses"][tables["masses"]["visit"] == visit].iloc[0]
        bos = summary[f"BOS mass at answer positions (test rows), visit {visit}"]
        assert bos == row["bos_mass"]


def test_the_answer_groups_count_earlier_matching_demonstrations(rows):
    sets = computed_case(rows, SPEC)
    positions = computed_positions(rows, SPEC)
    for r in range(rows.shape[0]):
        arrows = [t for t in range(rows.shape[1]) if positions.classes[r, t] >= 0]
        for i, t in enumerate(arrows):
            earlier = sum(positions.classes[r, s] == positions.classes[r, t] for s in arrows[:i])
            want = min(int(earlier), 4) if positions.answer[r, t] else 0
            assert int(sets.n_demos[r, t]) == want
