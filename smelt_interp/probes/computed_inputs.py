"""Computed-class recall rows (data.computed_recall) for the probes that read them (the linear
probe, the tracked head): held-out rows of the checkpoint's own spec, at its trained row length,
each set from its own seed namespace ("{namespace}:{seed}"), so rows that choose or fit never
are rows that score.

The spec and row length are the checkpoint's (ProbeInputs.computed_recall and computed_row_len,
which probes.session fills from its provenance); a model that never trained the task is read on
the default spec at DEFAULT_ROW_LEN. Rows are bytes: a model of another tokenizer is refused in
one ProbeError line, as a model whose vocabulary or context the rows do not fit."""

from __future__ import annotations

import torch

from smelt_interp.data.computed_recall import ComputedRecallSpec, computed_rows, n_demos_for
from smelt_interp.errors import DataError, ProbeError
from smelt_interp.model.protocol import LoopedModel
from smelt_interp.probes.inputs import ProbeInputs, is_byte_tokenizer

DEFAULT_ROW_LEN = 66  # 10 demonstrations and the query, for a model not trained on the task


def row_length(model: LoopedModel, trained: int | None) -> int:
    """The rows' length: the trained one (else DEFAULT_ROW_LEN), cut to the model's context."""
    length = min(trained or DEFAULT_ROW_LEN, model.cfg.max_seq_len)
    try:
        n_demos_for(length)
    except DataError as exc:
        raise ProbeError(f"this model's context is too short for computed recall: {exc}") from None
    return length


def heldout_rows(
    model: LoopedModel,
    n_rows: int,
    length: int,
    seed: int,
    namespace: str,
    spec: ComputedRecallSpec,
) -> torch.Tensor:
    """`n_rows` held-out rows [n_rows, length] of `spec` from seed "{namespace}:{seed}", checked
    against the model (ids and length)."""
    rows = computed_rows(n_rows, length, f"{namespace}:{seed}", split="heldout", spec=spec)
    try:
        model.check_tokens(rows)
    except DataError as exc:
        raise ProbeError(f"computed-recall rows do not fit this model: {exc}") from None
    return rows


def probe_rows(
    model: LoopedModel, inputs: ProbeInputs, namespace: str
) -> tuple[torch.Tensor, ComputedRecallSpec]:
    """(inputs.n_seqs held-out rows of the namespace, their spec) for a probe run."""
    if not is_byte_tokenizer(inputs.tokenizer):
        raise ProbeError(
            "computed-recall rows are spelled in bytes, and this model reads another "
            f"tokenizer ({type(inputs.tokenizer).__name__}, {inputs.tokenizer.vocab_size} ids)"
        )
    spec = inputs.computed_recall
    length = row_length(model, inputs.computed_row_len)
    return heldout_rows(model, inputs.n_seqs, length, inputs.seed, namespace, spec), spec
