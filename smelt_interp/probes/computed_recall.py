"""The tracked head on computed-class recall rows (data.computed_recall) and where it looks: the
head chosen by per-visit mean ablation on validation rows (measure.head_choice: the head of a
looped layer whose ablation at visit 1 drops answer accuracy most), then its BOS mass and its
mass on the matching demonstrations' labels at the answer positions of separate test rows, at
each visit of its layer (measure.computed_case: the case study's masses on these rows).

Choosing on held-out rows of seed namespace "validation:{seed}" and measuring on rows of
"test:{seed}" (inputs.n_seqs rows each, the checkpoint's spec: probes.computed_inputs) keeps the
reported masses free of the selection: a head picked because of its rows' quirks shows none of
them on the test rows. Tables: `ablation` (every candidate head: accuracy before and after, the
drop, the chosen one marked) and `masses` (the chosen head at each visit of its layer, beside
uniform attention's levels). Not registered: run it by module.

    python -m smelt_interp.probes.computed_recall ckpt.pt [--n-seqs N] [--seed S] [--json OUT]
"""

from __future__ import annotations

import pandas as pd
import torch

from smelt_interp.data.computed_recall import ComputedRecallSpec
from smelt_interp.errors import DataError, ProbeError
from smelt_interp.measure.attention_stats import DEFAULT_CHUNK
from smelt_interp.measure.batching import DEFAULT_BATCH
from smelt_interp.measure.computed_case import answer_head_masses
from smelt_interp.measure.head_choice import choose_head
from smelt_interp.model.protocol import LoopedModel
from smelt_interp.probes.computed_inputs import probe_rows
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import ProbeOptions, ProbeSpec, Tables, summary

VALIDATION, TEST = "validation", "test"  # the two held-out seed namespaces
MASS_COLUMNS = ("bos_mass", "demo_mass")


def tracked_head(
    model: LoopedModel,
    validation: torch.Tensor,
    test: torch.Tensor,
    spec: ComputedRecallSpec,
    *,
    batch_size: int = DEFAULT_BATCH,
    chunk: int | None = DEFAULT_CHUNK,
) -> Tables:
    """The head chosen on `validation` rows and its masses at the answer positions of `test`
    rows (both computed-recall rows of `spec`): tables `ablation` and `masses`."""
    try:
        choice = choose_head(model, validation, spec, batch_size=batch_size)
        heads = answer_head_masses(model, test, spec, batch_size=batch_size, chunk=chunk)
    except DataError as exc:
        raise ProbeError(f"the tracked head: {exc}") from None
    chosen = (choice.table["layer"] == choice.layer) & (choice.table["head"] == choice.head)
    ablation = choice.table.assign(chosen=chosen, note=chosen.map({True: choice.note, False: ""}))
    frame = heads.frame()
    masses = frame[(frame["layer"] == choice.layer) & (frame["head"] == choice.head)]
    masses = masses[["layer", "visit", "depth", "head", *MASS_COLUMNS]].assign(
        **{f"{stat}_uniform": heads.uniform[stat] for stat in MASS_COLUMNS},
        n_positions=heads.counts[MASS_COLUMNS[0]],
    )
    return {"ablation": ablation, "masses": masses.reset_index(drop=True)}


def run(model: LoopedModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    """tracked_head on inputs.n_seqs validation rows and as many test rows."""
    validation, spec = probe_rows(model, inputs, VALIDATION)
    test, _ = probe_rows(model, inputs, TEST)
    return tracked_head(model, validation, test, spec, batch_size=opts.batch_size, chunk=opts.chunk)


def summarize(tables: Tables) -> pd.DataFrame:
    """The chosen head, validation accuracy before and after its ablation, and its BOS and
    matching-demonstration masses on the test rows at visits 0 and 1."""
    chosen = tables["ablation"][tables["ablation"]["chosen"]].iloc[0]
    rows = [
        ("tracked head: layer", float(chosen["layer"]), ""),
        ("tracked head: head", float(chosen["head"]), ""),
        ("tracked head: ablated visit", float(chosen["visit"]), ""),
        ("answer accuracy (validation rows)", float(chosen["accuracy_before"]), ""),
        ("answer accuracy, tracked head ablated", float(chosen["accuracy_after"]), ""),
    ]
    masses = tables["masses"]
    for stat, name in (("bos_mass", "BOS mass"), ("demo_mass", "matching-demonstration mass")):
        for visit in (0, 1):
            at = masses[masses["visit"] == visit]
            if not at.empty:
                value = float(at[stat].iloc[0])
                rows.append((f"{name} at answer positions (test rows), visit {visit}", value, ""))
    return summary(rows)


PROBE = ProbeSpec(
    "computed_recall",
    "The tracked head on computed-recall rows: the head whose mean ablation at visit 1 drops "
    "validation answer accuracy most, and its BOS and matching-demonstration masses on test rows.",
    run,
    summarize,
    tables=("ablation", "masses"),
)


if __name__ == "__main__":
    from smelt_interp.probes.cli import run_probe_command

    run_probe_command(PROBE)
