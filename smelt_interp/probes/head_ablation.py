"""The proof that the case study's heads do their jobs, on held-out associative-recall rows
(data.assoc_recall, whose docstring defines the position sets): the *retrieval head* (the
(layer, visit, head) with the largest demonstration-answer mass at answer positions) and the
*parked head* (the largest BOS mass at non-answer positions, among the heads that meet the sink
definition, BOS mass there >= measure.sink.SINK_BOS; when none does, its run says so and ablates
nothing) are each mean-ablated at their
`attn.hook_z` (probes.interventions.mean_ablate_head; the mean over every position of the
rows), and answer-position accuracy and non-answer loss are measured before and after, beside
chance (1 / alphabet). If retrieval lives in that head, ablating it drops accuracy to near
chance; a parked head writes next to nothing, so ablating it changes non-answer loss by little.
The seeds command (smelt_interp.commands.seeds) runs it on every seed's checkpoints, and the
report runs it as the registered probe `head_ablation` (PROBE: tables `runs` and `masses`) on the
case study's recall rows; on a checkpoint of another task it does not apply."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from smelt_interp.data.assoc_recall import (
    AssocRecallSpec,
    RecallPositions,
    recall_positions,
    recall_rows,
)
from smelt_interp.errors import ProbeError
from smelt_interp.loading import load_model
from smelt_interp.machine import memory_limit_bytes
from smelt_interp.measure.batching import DEFAULT_BATCH, capture, inference
from smelt_interp.measure.case_positions import check_recall_rows
from smelt_interp.measure.group_masses import recall_masses
from smelt_interp.measure.sink import SINK_BOS
from smelt_interp.model.protocol import hook_name
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes.inputs import ProbeInputs, probe_bytes
from smelt_interp.probes.interventions import mean_ablate_head, mean_ablate_heads
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary
from smelt_interp.provenance import TASK_RECALL, Provenance

DEFAULT_ROWS = 64
DEFAULT_SEQ_LEN = 256
RETRIEVAL_MASS = 0.5  # a head that puts this much on the demonstration answers retrieves


def head_masses(
    model: SmeltModel,
    rows: torch.Tensor,
    trigger_ids: tuple[int, ...],
    batch_size: int = DEFAULT_BATCH,
) -> pd.DataFrame:
    """Per (layer, visit, head): `demo_mass`, the attention on the demonstration answers at
    answer positions, and `bos_mass`, on BOS at non-answer positions, each pooled over every
    such position of the rows (the case study's reducer, group_masses.recall_masses)."""
    masses = recall_masses(model, rows, trigger_ids, batch_size=batch_size)
    n_groups = masses.counts.shape[1]
    answer = masses.group(range(1, n_groups - 1))  # n_demos >= 1: the answer positions
    non_answer = masses.group([n_groups - 1])
    if not answer.n_positions or not non_answer.n_positions:
        raise ProbeError("the rows hold no answer positions or no non-answer positions")
    demo = answer.head_masses(model.schedule).values["demo_mass"]
    bos = non_answer.head_masses(model.schedule).values["bos_mass"]
    records = [
        {
            "layer": layer,
            "visit": visit,
            "head": head,
            "demo_mass": float(demo[i, head]),
            "bos_mass": float(bos[i, head]),
        }
        for i, (layer, visit) in enumerate(model.schedule)
        for head in range(model.cfg.n_heads)
    ]
    return pd.DataFrame(records)


def answer_accuracy(logits: torch.Tensor, positions: RecallPositions) -> float:
    """Share of answer positions whose argmax next token is the successor."""
    hits = logits.argmax(dim=-1) == positions.targets.to(logits.device)
    return float(hits[positions.answer].double().mean())


def non_answer_loss(logits: torch.Tensor, positions: RecallPositions) -> float:
    """Mean next-token cross-entropy at non-answer positions that have a target in the row."""
    mask = positions.non_answer
    ce = F.cross_entropy(
        logits.double().flatten(0, 1), positions.targets.flatten(), reduction="none"
    )
    return float(ce[mask.flatten()].mean())


def mean_z(
    model: SmeltModel, rows: torch.Tensor, layer: int, visit: int, head: int
) -> torch.Tensor:
    """The head's mean `hook_z` [d_head] over every position of the rows."""
    name = hook_name(layer, visit, "attn.hook_z")
    _, cache = capture(model, rows, [name])
    return cache[name][:, :, head].double().mean(dim=(0, 1)).float()


@dataclass(frozen=True)
class HeadAblation:
    """`masses`: head_masses of the rows; `table`: one row per run (clean, then each role's
    head ablated) with layer, visit, head, its masses, answer_acc, non_answer_loss, chance and
    the changes from the clean run."""

    masses: pd.DataFrame
    table: pd.DataFrame


def chosen_heads(masses: pd.DataFrame) -> dict[str, pd.Series]:
    """{role: the row of masses of that role's head}: the retrieval head always, the parked head
    only when one meets the sink definition (bos_mass >= SINK_BOS)."""
    chosen = {"retrieval": masses.loc[masses["demo_mass"].idxmax()]}
    top = masses.loc[masses["bos_mass"].idxmax()]
    if top["bos_mass"] >= SINK_BOS:
        chosen["parked"] = top
    return chosen


def no_sink_note(masses: pd.DataFrame) -> str:
    """What the parked-head run says when no head is a sink: the threshold and the largest."""
    top = masses.loc[masses["bos_mass"].idxmax()]
    at = f"{int(top['layer'])}.{int(top['visit'])}.{int(top['head'])}"
    return (
        f"no head meets the sink definition (BOS mass at non-answer positions >= {SINK_BOS:g}); "
        f"the most is {at} at {top['bos_mass']:.3f}"
    )


def retrieval_heads(masses: pd.DataFrame) -> list[tuple[int, int, int]]:
    """(layer, visit, head) of every head with demonstration-answer mass >= RETRIEVAL_MASS,
    or of the top one when none reaches it."""
    team = masses[masses["demo_mass"] >= RETRIEVAL_MASS]
    if team.empty:
        team = masses.loc[[masses["demo_mass"].idxmax()]]
    return [(int(r["layer"]), int(r["visit"]), int(r["head"])) for _, r in team.iterrows()]


def ablate_heads(
    model: SmeltModel,
    rows: torch.Tensor,
    spec: AssocRecallSpec,
    masses: pd.DataFrame | None = None,
) -> HeadAblation:
    """Mean-ablate the retrieval head and the parked head of `rows` (rows of `spec`) in turn,
    then every retrieval head at once (retrieval_heads; the heads chosen from `masses`,
    measured here when not given), and measure each run against the clean one."""
    model.eval()
    check_recall_rows(rows, spec.trigger_ids, "the head ablation", need_demos=True)
    positions = recall_positions(rows, spec.trigger_ids)
    if masses is None:
        masses = head_masses(model, rows, spec.trigger_ids)
    with inference(model):
        clean = model(rows)
    runs: list[dict[str, Any]] = [
        {
            "run": "clean",
            "answer_acc": answer_accuracy(clean, positions),
            "non_answer_loss": non_answer_loss(clean, positions),
        }
    ]
    chosen = chosen_heads(masses)
    for role, head in chosen.items():
        at = int(head["layer"]), int(head["visit"]), int(head["head"])
        edited = mean_ablate_head(model, rows, *at, mean_z(model, rows, *at)).logits
        runs.append(
            {
                "run": f"{role} head ablated",
                "role": role,
                "layer": at[0],
                "visit": at[1],
                "head": at[2],
                "demo_mass": float(head["demo_mass"]),
                "bos_mass": float(head["bos_mass"]),
                "answer_acc": answer_accuracy(edited, positions),
                "non_answer_loss": non_answer_loss(edited, positions),
            }
        )
    if "parked" not in chosen:  # nothing ablated: the run says why
        runs.append({"run": "parked head ablated", "role": "parked", "note": no_sink_note(masses)})
    # one head is seldom the whole circuit: a model can grow several that retrieve
    team = retrieval_heads(masses)
    edits = [(*at, mean_z(model, rows, *at)) for at in team]
    edited = mean_ablate_heads(model, rows, edits).logits
    runs.append(
        {
            "run": "retrieval heads ablated",
            "role": "retrieval heads",
            "heads": " ".join(f"{layer}.{visit}.{head}" for layer, visit, head in team),
            "answer_acc": answer_accuracy(edited, positions),
            "non_answer_loss": non_answer_loss(edited, positions),
        }
    )
    table = pd.DataFrame(runs)
    table["chance"] = 1.0 / spec.alphabet
    table["answer_acc_change"] = table["answer_acc"] - runs[0]["answer_acc"]
    table["non_answer_loss_change"] = table["non_answer_loss"] - runs[0]["non_answer_loss"]
    return HeadAblation(masses, table)


def ablate_checkpoint(
    path: str | Path, n_rows: int = DEFAULT_ROWS, seq_len: int | None = None, seed: int = 0
) -> HeadAblation:
    """ablate_heads on held-out rows of the task the checkpoint trained on (the rows' memory
    checked before they are drawn)."""
    model, info = load_model(path, device="cpu")
    spec = Provenance.of(info).recall_spec
    length = min(seq_len or DEFAULT_SEQ_LEN, model.cfg.max_seq_len)
    need = probe_bytes([model.cfg], n_rows, length, 0, DEFAULT_BATCH)
    if need > memory_limit_bytes():
        raise ProbeError(
            f"--n-rows {n_rows} x --seq-len {length} needs about {need / 2**30:,.1f} GiB of "
            f"memory, more than this machine has"
        )
    rows = recall_rows(n_rows, length, seed, split="heldout", spec=spec)
    return ablate_heads(model, rows, spec)


def run(model: SmeltModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    """ablate_heads on the case study's held-out recall rows (the checkpoint's recall spec):
    `runs` (one row per run, clean first) and `masses` (every head's, the heads chosen from)."""
    if inputs.case_task != TASK_RECALL:
        raise ProbeError(
            "the head ablation reads associative-recall rows: a checkpoint trained on "
            "assoc_recall, or --task assoc_recall"
        )
    rows = inputs.recall_rows()
    masses = head_masses(model, rows, inputs.assoc_recall.trigger_ids, opts.batch_size)
    result = ablate_heads(model, rows, inputs.assoc_recall, masses)
    return {"runs": result.table, "masses": result.masses}


def summarize(result: Tables) -> pd.DataFrame:
    """Answer accuracy clean and with each role's head ablated (beside chance), and the change
    in non-answer loss from ablating the parked head."""
    runs = result["runs"].set_index("run")
    rows = [("answer accuracy, clean", float(runs.loc["clean", "answer_acc"]), "")]
    for run_name in ("retrieval head ablated", "retrieval heads ablated", "parked head ablated"):
        if run_name in runs.index and not pd.isna(runs.loc[run_name, "answer_acc"]):
            rows.append(
                (f"answer accuracy, {run_name}", float(runs.loc[run_name, "answer_acc"]), "")
            )
    parked = "parked head ablated"
    if parked in runs.index and not pd.isna(runs.loc[parked, "non_answer_loss_change"]):
        rows.append(
            (
                "non-answer loss change, parked head ablated",
                float(runs.loc[parked, "non_answer_loss_change"]),
                "",
            )
        )
    rows.append(("chance (1 / alphabet)", float(runs["chance"].iloc[0]), ""))
    return summary(rows)


PROBE = ProbeSpec(
    "head_ablation",
    "Mean-ablation of the case study's heads on held-out associative-recall rows: the retrieval "
    "head, the parked (sink) head, then every retrieval head; answer accuracy and non-answer "
    "loss before and after, beside chance.",
    run,
    summarize,
    tables=("runs", "masses"),
    figures=(FigureSpec("ablation_accuracy", "runs", "Answer accuracy with the heads ablated"),),
)


if __name__ == "__main__":  # started by name, so this module does not import the command line
    import runpy

    runpy.run_module("smelt_interp.commands.head_ablation", run_name="__main__", alter_sys=True)
