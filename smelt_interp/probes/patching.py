"""Causal patching per (layer, visit, head): which visit's heads carry the answer of a prompt pair
(measure.patching, measure.path_patching, measure.patch_tables compute every number).

As a registered probe it runs on the model's own task: a Dyck model on held-out prompts with a
changed bracket, a recall model on held-out rows with a changed key (data.patch_pairs), and
returns `heads` (activation and attribution patching of every head's z at every visit),
`visits` (the same per (layer, visit) for the residual stream, attention output and MoE write)
and `cross_visit` (visit 1 of each head given visit 0's z, and the reverse). The command adds
the user's own pair, per-position nodes and path patching:

    python -m smelt_interp.probes.patching MODEL [--pair dyck|recall]
        [--clean TEXT --corrupt TEXT | --clean-ids 1,2 --corrupt-ids 1,3] [--answers A,B]
        [--metric logit_diff|loss] [--site z] [--per-position]
        [--sender L.V.H ... --receiver L.V.H.q|k|v [--freeze-mlp]] [--csv OUT] [--json OUT]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd

from smelt_interp.checkpoint import CheckpointInfo
from smelt_interp.data.bpe import Tokenizer
from smelt_interp.data.patch_pairs import (
    DEFAULT_ROWS,
    DYCK_WORDS,
    PAIR_KINDS,
    UNKNOWN,
    PromptPair,
    dyck_pair,
    ids_pair,
    recall_pair,
    user_pair,
)
from smelt_interp.errors import DataError, ProbeError
from smelt_interp.loading import model_tokenizer
from smelt_interp.measure.patch_tables import cross_visits, headline, side_by_side, visit_sites
from smelt_interp.model.protocol import LoopedModel
from smelt_interp.probes.inputs import ProbeInputs, is_byte_tokenizer
from smelt_interp.probes.registry import FigureSpec, ProbeOptions, ProbeSpec, Tables, summary
from smelt_interp.provenance import TASK_RECALL, Provenance


def task_pair(model: LoopedModel, inputs: ProbeInputs, n_rows: int = DEFAULT_ROWS) -> PromptPair:
    """The default pair of the model's task (inputs.case_task): changed-bracket Dyck prompts of
    the task's bracket types in the model's tokens, or changed-key recall rows of its spec (byte
    rows), fitted to its context."""
    task = inputs.case_task
    try:
        if task == TASK_RECALL:
            inputs.require_bytes("the patching probe's recall pairs")
            length = min(inputs.seq_len, model.cfg.max_seq_len)
            return recall_pair(n_rows, length, inputs.seed, spec=inputs.assoc_recall)
        words = dataclasses.replace(DYCK_WORDS, n_pairs=inputs.dyck.n_pairs)
        limit = model.cfg.max_seq_len
        return dyck_pair(n_rows, inputs.seed, words, max_len=limit, tokenizer=inputs.tokenizer)
    except DataError as exc:
        raise ProbeError(str(exc)) from None


@dataclass(frozen=True)
class PairRequest:
    """Which prompt pair to patch: `kind` dyck|recall (None: the model's task), or the user's
    own as texts (`clean`, `corrupt`) or id rows; `answers` (clean, corrupt) token ids, else the
    model's predictions."""

    kind: str | None = None
    clean: str | None = None
    corrupt: str | None = None
    clean_ids: tuple[int, ...] | None = None
    corrupt_ids: tuple[int, ...] | None = None
    answers: tuple[int, int] | None = None
    n_rows: int = DEFAULT_ROWS
    seed: int = 0


def _user_rows(request: PairRequest, tokenizer: Tokenizer) -> tuple[list[int], list[int]] | None:
    texts = (request.clean, request.corrupt)
    ids = (request.clean_ids, request.corrupt_ids)
    if any(t is not None for t in texts) and any(i is not None for i in ids):
        raise ProbeError("give the pair as two texts or as two id rows, not both")
    if any(t is not None for t in texts):
        if None in texts:
            raise ProbeError("give both --clean and --corrupt")
        return tokenizer.encode(request.clean), tokenizer.encode(request.corrupt)
    if any(i is not None for i in ids):
        if None in ids:
            raise ProbeError("give both --clean-ids and --corrupt-ids")
        return list(request.clean_ids), list(request.corrupt_ids)
    return None


def request_pair(model: LoopedModel, info: CheckpointInfo, request: PairRequest) -> PromptPair:
    """The pair a command line or a page asked for, in the model's tokens."""
    provenance = Provenance.of(info)
    rows = _user_rows(request, model_tokenizer(info))
    if rows is not None:
        answers = request.answers or (UNKNOWN, UNKNOWN)
        return user_pair(*rows, *answers)
    kind = request.kind or ("recall" if provenance.task == TASK_RECALL else "dyck")
    try:
        pair = _task_pair(model, provenance, kind, request, model_tokenizer(info))
        model.check_tokens(pair.clean)
    except DataError:  # no task text this model can read (ids only): a row of ids instead
        if request.kind is not None:
            raise
        return ids_pair(model.cfg.vocab_size, model.cfg.max_seq_len, request.seed)
    return pair


def _task_pair(
    model: LoopedModel,
    provenance: Provenance,
    kind: str,
    request: PairRequest,
    tokenizer: Tokenizer,
) -> PromptPair:
    if kind not in PAIR_KINDS:
        raise ProbeError(f"unknown pair {kind!r}; the pairs are {', '.join(PAIR_KINDS)}")
    limit = model.cfg.max_seq_len
    if kind == "recall":
        if not is_byte_tokenizer(tokenizer):  # a recall row's ids are its bytes
            raise ProbeError(
                "the recall pair is a row of bytes, which this model's tokenizer reads "
                "otherwise; patch a Dyck pair or your own (--clean TEXT --corrupt TEXT)"
            )
        spec = provenance.recall_spec if provenance.task == TASK_RECALL else None
        length = min(provenance.row_len(TASK_RECALL) or 64, limit)
        return recall_pair(request.n_rows, length, request.seed, spec=spec)
    words = dataclasses.replace(DYCK_WORDS, n_pairs=provenance.dyck_spec.n_pairs)
    return dyck_pair(request.n_rows, request.seed, words, max_len=limit, tokenizer=tokenizer)


def run(model: LoopedModel, inputs: ProbeInputs, opts: ProbeOptions) -> Tables:
    pair = task_pair(model, inputs, min(inputs.n_seqs, DEFAULT_ROWS))
    try:  # a pair the model cannot read (ids past its vocabulary) is a probe that does not apply
        model.check_tokens(pair.clean)
    except DataError as exc:
        raise ProbeError(f"the {pair.label} pair does not fit this model: {exc}") from None
    heads = side_by_side(model, pair, "z", per_head=True, batch=opts.batch_size)
    visits = visit_sites(model, pair, batch=opts.batch_size)
    cross = cross_visits(model, pair, "z", batch=opts.batch_size)
    heads.attrs.update(pair=pair.label)
    return {"heads": heads, "visits": visits, "cross_visit": cross}


def summarize(result: Tables) -> pd.DataFrame:
    heads, cross = result["heads"], result["cross_visit"]
    return summary([(name, value, "") for name, value in headline(heads, cross)])


PROBE = ProbeSpec(
    "patching",
    "Activation and attribution patching of every head's z per (layer, visit), clean -> "
    "corrupted on the model's task (a changed bracket or key), 0 = corrupted, 1 = clean.",
    run,
    summarize,
    tables=("heads", "visits", "cross_visit"),
    figures=(
        FigureSpec(
            "patching_heads",
            "heads",
            "Activation patching per (layer, visit) and head",
            per_model=True,
        ),
    ),
)


if __name__ == "__main__":  # started by name, so this module does not import the command line
    import runpy

    runpy.run_module("smelt_interp.commands.patching", run_name="__main__", alter_sys=True)
