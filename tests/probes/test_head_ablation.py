"""The head-ablation proof on a tiny trained recall model: the mean ablation edits exactly the
chosen head's z at its visit (the other heads' z, read at the output projection, are as in the
clean run), the reported accuracy and loss equal a direct count on a model ablated by a plain
forward hook, and the masses that choose the heads equal a loop over hook_pattern."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.data.assoc_recall import AssocRecallSpec, recall_positions, recall_rows
from smelt_interp.errors import ProbeError
from smelt_interp.measure.sink import SINK_BOS
from smelt_interp.probes.head_ablation import (
    ablate_checkpoint,
    ablate_heads,
    chosen_heads,
    head_masses,
    mean_z,
    no_sink_note,
)
from smelt_interp.probes.interventions import mean_ablate_head
from smelt_interp.provenance import Provenance
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import get_preset
from smelt_interp.train.trainer import Trainer

N_ROWS, SEQ_LEN = 12, 96


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A recall-pair-tiny Baseline (seconds of training) with two heads a layer, so an ablated
    head has a neighbour whose z must stay as it was; its rows and their position sets."""
    preset = get_preset("recall-pair-tiny")
    two_heads = {**preset["model"], "n_heads": 2, "n_kv_heads": 2, "d_head": 16}
    cfg = TrainConfig.from_dict({**preset, "model": two_heads, "threads": 1})
    out = tmp_path_factory.mktemp("recall") / "baseline"
    Trainer(cfg, out, progress=False).run()
    model, info = load_checkpoint(out / "ckpt.pt")
    spec = Provenance.of(info).recall_spec
    rows = recall_rows(N_ROWS, SEQ_LEN, 0, split="heldout", spec=spec)
    positions = recall_positions(rows, spec.trigger_ids)
    return out / "ckpt.pt", model, spec, rows, positions


def z_at_output(model, rows, layer: int, visit: int, run) -> torch.Tensor:
    """The z [b, T, heads, d_head] that (layer, visit) feeds its output projection during
    `run()`: the visit-th call of that layer's W_o."""
    calls: list[torch.Tensor] = []
    handle = model.blocks[layer].attn.W_o.register_forward_pre_hook(
        lambda _m, args: calls.append(args[0].detach().clone())
    )
    try:
        run()
    finally:
        handle.remove()
    cfg = model.cfg
    return calls[visit].view(rows.shape[0], rows.shape[1], cfg.n_heads, cfg.d_head)


def test_the_ablation_changes_exactly_that_heads_z(trained):
    _, model, _, rows, _ = trained
    for layer, visit in [model.schedule[0], model.schedule[-1]]:
        head = 1
        mean = mean_z(model, rows, layer, visit, head)
        with torch.no_grad():
            clean = z_at_output(model, rows, layer, visit, lambda: model(rows))
        edited = z_at_output(
            model, rows, layer, visit, lambda: mean_ablate_head(model, rows, layer, visit, 1, mean)
        )
        others = [h for h in range(model.cfg.n_heads) if h != head]
        assert torch.equal(edited[:, :, others], clean[:, :, others])
        assert torch.equal(edited[:, :, head], mean.expand_as(edited[:, :, head]))
        assert not torch.equal(edited[:, :, head], clean[:, :, head])
        torch.testing.assert_close(mean, clean[:, :, head].double().mean(dim=(0, 1)).float())


def test_reported_accuracy_and_loss_equal_a_direct_count(trained):
    _, model, spec, rows, positions = trained
    result = ablate_heads(model, rows, spec)
    table = result.table.set_index("run")
    runs = ["clean", "retrieval head ablated", "parked head ablated", "retrieval heads ablated"]
    assert list(table.index) == runs
    assert (table["chance"] == 1 / spec.alphabet).all()
    team = [
        tuple(map(int, h.split("."))) for h in table.loc["retrieval heads ablated", "heads"].split()
    ]
    masses = result.masses.set_index(["layer", "visit", "head"])["demo_mass"]
    assert team == [at for at, m in masses.items() if m >= 0.5] or team == [masses.idxmax()]
    for run, row in table.iterrows():
        if isinstance(row.get("note"), str):  # no parked head: nothing was ablated
            assert run == "parked head ablated"
            assert "no head meets the sink definition" in row["note"]
            assert result.masses["bos_mass"].max() < SINK_BOS and math.isnan(row["answer_acc"])
            continue
        if run == "clean":
            ablated = []
        elif run == "retrieval heads ablated":
            ablated = team
        else:
            ablated = [(int(row["layer"]), int(row["visit"]), int(row["head"]))]
        handles = []
        for layer, visit, head in ablated:
            mean = mean_z(model, rows, layer, visit, head)

            def edit(_m, _args, out, head=head, mean=mean):
                out = out.clone()
                out[:, :, head] = mean
                return out

            point = model.blocks[layer].visits[visit].attn.hook_z
            handles.append(point.register_forward_hook(edit))
        try:
            with torch.no_grad():
                logits = model(rows).double()
        finally:
            for handle in handles:
                handle.remove()
        hits = total = 0
        ce, n_ce = 0.0, 0
        for r in range(rows.shape[0]):
            for q in range(rows.shape[1] - 1):
                target = int(rows[r, q + 1])
                if positions.answer[r, q]:
                    hits += int(logits[r, q].argmax()) == target
                    total += 1
                if positions.non_answer[r, q]:
                    ce -= float(torch.log_softmax(logits[r, q], dim=-1)[target])
                    n_ce += 1
        assert total > 0 and n_ce > 0
        assert row["answer_acc"] == pytest.approx(hits / total, abs=1e-12)
        assert row["non_answer_loss"] == pytest.approx(ce / n_ce, rel=1e-9)
    assert table.loc["clean", "answer_acc_change"] == 0


def test_masses_equal_a_loop_over_the_pattern_and_choose_the_heads(trained):
    _, model, _, rows, positions = trained
    few = rows[:3]
    ids = AssocRecallSpec().trigger_ids
    pos = recall_positions(few, ids)
    masses = head_masses(model, few, ids, batch_size=2)
    names = [f"blocks.{la}.visits.{v}.attn.hook_pattern" for la, v in model.schedule]
    with torch.no_grad():
        _, cache = model.run_with_cache(few, names_filter=lambda n: n in names)
    for i, (layer, visit) in enumerate(model.schedule):
        pattern = cache[names[i]].double()
        for head in range(model.cfg.n_heads):
            demo = bos = 0.0
            n_answer = n_non = 0
            for r in range(few.shape[0]):
                for q in range(few.shape[1]):
                    if pos.answer[r, q]:
                        keys = [k for k in range(q + 1) if pos.demos[r, q, k]]
                        demo += sum(float(pattern[r, head, q, k]) for k in keys)
                        n_answer += 1
                    if pos.non_answer[r, q]:
                        bos += float(pattern[r, head, q, 0])
                        n_non += 1
            at = (masses["layer"] == layer) & (masses["visit"] == visit)
            got = masses[at & (masses["head"] == head)].iloc[0]
            assert got["demo_mass"] == pytest.approx(demo / n_answer, abs=1e-6)
            assert got["bos_mass"] == pytest.approx(bos / n_non, abs=1e-6)
    heads = chosen_heads(masses)
    assert heads["retrieval"]["demo_mass"] == masses["demo_mass"].max()
    if masses["bos_mass"].max() >= SINK_BOS:
        assert heads["parked"]["bos_mass"] == masses["bos_mass"].max()
    else:
        assert "parked" not in heads


def test_the_parked_head_meets_the_sink_definition_or_there_is_none():
    """Hand-made masses: the head with the most BOS mass is parked only at SINK_BOS or more."""
    masses = pd.DataFrame(
        [
            {"layer": 0, "visit": 0, "head": 0, "demo_mass": 0.9, "bos_mass": 0.04},
            {"layer": 1, "visit": 0, "head": 1, "demo_mass": 0.1, "bos_mass": 0.17},
        ]
    )
    heads = chosen_heads(masses)
    assert "parked" not in heads and heads["retrieval"]["head"] == 0
    assert "1.0.1 at 0.170" in no_sink_note(masses) and f">= {SINK_BOS:g}" in no_sink_note(masses)
    masses.loc[1, "bos_mass"] = SINK_BOS  # exactly the threshold: a sink
    assert chosen_heads(masses)["parked"]["head"] == 1
    masses.loc[0, "bos_mass"] = 0.8
    assert chosen_heads(masses)["parked"]["layer"] == 0


def test_ablate_checkpoint_reads_the_task_from_the_checkpoint(trained):
    path, _, spec, _, _ = trained
    result = ablate_checkpoint(path, n_rows=4, seq_len=64)
    assert len(result.masses) == 4 * 2  # 4 layer visits x 2 heads of the Baseline
    assert math.isclose(result.table["chance"].iloc[0], 1 / spec.alphabet)


def test_the_registered_probe_is_the_ablation_on_the_case_studys_rows(trained, tiny_pair):
    """The probe the report runs (registry name head_ablation) gives ablate_heads' tables on
    the probes' recall rows, and does not apply to a checkpoint of another task."""
    from smelt_interp.figures.probes import probe_figures
    from smelt_interp.loading import load_model
    from smelt_interp.probes.inputs import ProbeRequest
    from smelt_interp.probes.registry import ProbeOptions, get, registered
    from smelt_interp.probes.session import make_inputs

    path, _, spec, _, _ = trained
    probe = get("head_ablation")
    assert probe in registered()
    model, info = load_model(path, device="cpu")
    inputs = make_inputs(ProbeRequest(n_seqs=4, seq_len=64), {"m": model}, {"m": info})
    tables = probe.run(model, inputs, ProbeOptions())
    direct = ablate_heads(model, recall_rows(4, 64, 0, split="heldout", spec=spec), spec)
    pd.testing.assert_frame_equal(tables["runs"], direct.table)
    pd.testing.assert_frame_equal(tables["masses"], direct.masses)
    lines = probe.summarize(tables).set_index("statistic")["value"]
    assert lines["answer accuracy, clean"] == direct.table["answer_acc"].iloc[0]
    assert lines["chance (1 / alphabet)"] == pytest.approx(1 / spec.alphabet)
    (fig,) = probe_figures(probe, {"m": tables})
    drawn = direct.table.dropna(subset=["answer_acc"])
    assert list(fig.data[0].x) == list(drawn["run"]) and list(fig.data[0].y) == list(
        drawn["answer_acc"]
    )
    dyck, dyck_info = load_model(tiny_pair["smelt"], device="cpu")
    dyck_inputs = make_inputs(ProbeRequest(n_seqs=2, seq_len=32), {"d": dyck}, {"d": dyck_info})
    with pytest.raises(ProbeError, match="associative-recall rows"):
        probe.run(dyck, dyck_inputs, ProbeOptions())
