"""The proof that the case study's heads do their jobs, on held-out associative-recall rows
(data.assoc_recall, whose docstring defines the position sets): the *retrieval head* (the
(layer, visit, head) with the largest demonstration-answer mass at answer positions) and the
*parked head* (the largest BOS mass at non-answer positions) are each mean-ablated at their
`attn.hook_z` (probes.interventions.mean_ablate_head; the mean over every position of the
rows), and answer-position accuracy and non-answer loss are measured before and after, beside
chance (1 / alphabet). If retrieval lives in that head, ablating it drops accuracy to near
chance; a parked head writes next to nothing, so ablating it changes non-answer loss by little.
The seeds command (smelt_interp.commands.seeds) runs it on every seed's checkpoints."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.data.assoc_recall import (
    AssocRecallSpec,
    RecallPositions,
    recall_positions,
    recall_rows,
)
from smelt_interp.errors import ProbeError
from smelt_interp.model.transformer import SmeltModel, hook_name
from smelt_interp.probes.common import DEFAULT_BATCH, capture
from smelt_interp.probes.interventions import mean_ablate_head

DEFAULT_ROWS = 64
DEFAULT_SEQ_LEN = 256
ROLES = ("retrieval", "parked")


def recall_spec(train_config: Mapping[str, Any] | None) -> AssocRecallSpec:
    """The associative-recall spec a checkpoint's run trained on (its train_config's
    `assoc_recall`), or the default one."""
    trained = (train_config or {}).get("assoc_recall")
    return AssocRecallSpec.from_mapping(trained) if trained is not None else AssocRecallSpec()


def heldout_recall(
    spec: AssocRecallSpec, n_rows: int, seq_len: int, seed: int = 0
) -> tuple[torch.Tensor, RecallPositions]:
    """Held-out rows [n_rows, seq_len] of `spec` and their position sets."""
    rows = recall_rows(n_rows, seq_len, seed, split="heldout", spec=spec)
    return rows, recall_positions(rows, spec.trigger_ids)


def head_masses(
    model: SmeltModel,
    rows: torch.Tensor,
    positions: RecallPositions,
    batch_size: int = DEFAULT_BATCH,
) -> pd.DataFrame:
    """Per (layer, visit, head): `demo_mass`, the attention on the demonstration answers at
    answer positions, and `bos_mass`, on BOS at non-answer positions, each pooled over every
    such position of the rows (float64 sums of `hook_pattern`).

    A small reducer of its own, to be replaced by the shared attention-mass reducer of
    smelt_interp.model when that exists, so that every measure reduces the pattern one way."""
    names = [hook_name(layer, visit, "attn.hook_pattern") for layer, visit in model.schedule]
    sums = torch.zeros(len(names), model.cfg.n_heads, 2, dtype=torch.float64)
    for lo in range(0, rows.shape[0], batch_size):
        part = slice(lo, lo + batch_size)
        _, cache = capture(model, rows[part], names)
        answer, non_answer = positions.answer[part], positions.non_answer[part]
        demos = positions.demos[part].double()
        for i, name in enumerate(names):
            pattern = cache[name].double()  # [b, h, q, k]
            demo = (pattern * demos[:, None]).sum(dim=-1)  # [b, h, q]
            sums[i, :, 0] += (demo * answer[:, None]).sum(dim=(0, 2))
            sums[i, :, 1] += (pattern[..., 0] * non_answer[:, None]).sum(dim=(0, 2))
    n_answer, n_non = int(positions.answer.sum()), int(positions.non_answer.sum())
    if not n_answer or not n_non:
        raise ProbeError("the rows hold no answer positions or no non-answer positions")
    records = [
        {
            "layer": layer,
            "visit": visit,
            "head": head,
            "demo_mass": float(sums[i, head, 0]) / n_answer,
            "bos_mass": float(sums[i, head, 1]) / n_non,
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
    mask = positions.non_answer.clone()
    mask[:, -1] = False  # the last query predicts nothing in the row
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
    """{role: the row of masses of that role's head}."""
    return {
        "retrieval": masses.loc[masses["demo_mass"].idxmax()],
        "parked": masses.loc[masses["bos_mass"].idxmax()],
    }


def ablate_heads(
    model: SmeltModel,
    rows: torch.Tensor,
    positions: RecallPositions,
    alphabet: int,
    masses: pd.DataFrame | None = None,
) -> HeadAblation:
    """Mean-ablate the retrieval head and the parked head in turn (the heads chosen from
    `masses`, measured here when not given) and measure each run against the clean one."""
    model.eval()
    masses = head_masses(model, rows, positions) if masses is None else masses
    with torch.no_grad():
        clean = model(rows)
    runs: list[dict[str, Any]] = [
        {
            "run": "clean",
            "answer_acc": answer_accuracy(clean, positions),
            "non_answer_loss": non_answer_loss(clean, positions),
        }
    ]
    for role, head in chosen_heads(masses).items():
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
    table = pd.DataFrame(runs)
    table["chance"] = 1.0 / alphabet
    table["answer_acc_change"] = table["answer_acc"] - runs[0]["answer_acc"]
    table["non_answer_loss_change"] = table["non_answer_loss"] - runs[0]["non_answer_loss"]
    return HeadAblation(masses, table)


def ablate_checkpoint(
    path: str | Path, n_rows: int = DEFAULT_ROWS, seq_len: int | None = None, seed: int = 0
) -> HeadAblation:
    """ablate_heads on held-out rows of the task the checkpoint trained on."""
    model, info = load_checkpoint(path)
    spec = recall_spec(info.train_config)
    length = min(seq_len or DEFAULT_SEQ_LEN, model.cfg.max_seq_len)
    rows, positions = heldout_recall(spec, n_rows, length, seed)
    return ablate_heads(model, rows, positions, spec.alphabet)
