"""What the seeds command (commands.seeds) measures on each final checkpoint, and the report
it writes. Associative recall: the case_study probe on held-out and control rows and the head
ablation on the held-out rows (commands.recall_seed_tables). Dyck: greedy exact match on
held-out words by depth (commands.dyck_seed_tables) and the case_study probe on in-context
prompts made of the same words. Both as JSON records and as Markdown, per seed and over seeds
(commands.case_seed_tables)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.commands import case_seed_tables, dyck_seed_tables, recall_seed_tables
from smelt_interp.commands.run_log import held_sink, train_seconds
from smelt_interp.commands.seed_runs import DYCK, RECALL, SeedRun
from smelt_interp.data.assoc_recall import AssocRecallSpec
from smelt_interp.data.dyck import DyckExample, DyckSpec
from smelt_interp.data.dyck_draws import TEST, VALIDATION
from smelt_interp.errors import DataError
from smelt_interp.measure import case_tables, group_masses
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes import case_study
from smelt_interp.probes.head_ablation import ablate_heads
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import ProbeOptions
from smelt_interp.provenance import CKPT_FILE, Provenance
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import PAIR

DEFAULT_RECALL_LEN = 256
# the JSON's names for the case-study frames (commands.case_seed_tables.KEYS), per seed and over
# seeds alike
JSON_NAMES = {"visits": "by_visit", "pairs": "visit_pairs", "split": "non_answer"}
JSON_NAMES["control"] = "control"


# The held-out stream of the rows the case study reports, and of the selection rows the
# tracked head of each looped layer is chosen on (case_seed_tables.choose_heads): another draw,
# none of whose rows is a reported row (selection_rows drops any that is).
REPORT_SEED, SELECTION_SEED = 0, 1


def recall_inputs(
    model: SmeltModel, spec: AssocRecallSpec, n_rows: int, seq_len: int, seed: int = REPORT_SEED
) -> ProbeInputs:
    """The probe inputs of the case study on `n_rows` held-out associative-recall rows of
    `spec` (the held-out stream of `seed`: every checkpoint is measured on the same rows)."""
    return ProbeInputs(
        n_seqs=n_rows,
        seq_len=seq_len,
        seed=seed,
        max_seq_len=model.cfg.max_seq_len,
        assoc_recall=spec,
        task="assoc_recall",
    )


def control_spec(spec: AssocRecallSpec) -> AssocRecallSpec:
    """The control of `spec`: every occurrence of a trigger draws a fresh successor, so an
    answer cannot be read off the demonstrations."""
    return dataclasses.replace(spec, repeat_successor=False)


def probe_run(
    run_dir: Path, cfg: TrainConfig, n_rows: int, seq_len: int | None
) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """(case-study frames (commands.case_seed_tables.checkpoint_figures, the control rows'
    included), model figures) of a run's final checkpoint."""
    ckpt = run_dir / CKPT_FILE
    model, info = load_checkpoint(ckpt)
    spec = Provenance.of(info).recall_spec
    length = min(seq_len or default_length(model), model.cfg.max_seq_len)
    inputs = recall_inputs(model, spec, n_rows, length)
    tables = case_study.run(model, inputs, ProbeOptions())
    selection = case_study.run(model, selection_inputs(model, spec, n_rows, length), ProbeOptions())
    control_inputs = recall_inputs(model, control_spec(spec), n_rows, length)
    control = case_study.run(model, control_inputs, ProbeOptions())
    rows = inputs.recall_rows()
    heads = recall_seed_tables.answer_heads(tables)  # the ablated heads are chosen from the probe's
    ablation = ablate_heads(model, rows, spec, masses=heads)
    figures = recall_seed_tables.model_figures(tables, heads, ablation.table, held_sink(run_dir))
    figures |= {
        "tokens": int(info.meta.get("tokens", 0)),
        "train_seconds": train_seconds(run_dir, cfg),
    }
    return case_seed_tables.checkpoint_figures(tables, selection, control), figures


def selection_inputs(
    model: SmeltModel, spec: AssocRecallSpec, n_rows: int, seq_len: int
) -> ProbeInputs:
    """The selection rows' probe inputs: `n_rows` held-out rows of the SELECTION_SEED stream,
    checked to share no row with the reported rows (a DataError names a clash)."""
    chosen = recall_inputs(model, spec, n_rows, seq_len, SELECTION_SEED)
    reported = recall_inputs(model, spec, n_rows, seq_len).recall_rows()
    seen = {tuple(row.tolist()) for row in reported}
    if any(tuple(row.tolist()) in seen for row in chosen.recall_rows()):
        raise DataError("the selection rows share a row with the reported rows")
    return chosen


def default_length(model: SmeltModel) -> int:
    """The rows' default length: the model's context, at most DEFAULT_RECALL_LEN tokens."""
    return min(DEFAULT_RECALL_LEN, model.cfg.max_seq_len)


def dyck_run(
    run: SeedRun, words: Sequence[Any], selection: Sequence[Any] = ()
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, pd.DataFrame] | None]:
    """(exact-match rows by depth, run figures, case-study frames) of a run's final checkpoint
    on `words`; the case study (the case_study probe's mass tables on in-context prompts made
    of the same words, dyck_seed_tables.in_context_prompts, reduced by
    commands.case_seed_tables) for the seed runs only (None for the rounding reruns)."""
    model, info = load_checkpoint(run.folder / CKPT_FILE)
    who = {"seed": run.cfg.seed, "model": run.cfg.arch, "threads": run.cfg.runtime.threads}
    rows = [who | row for row in dyck_seed_tables.exact_match_rows(model, words)]
    figures = who | {
        "role": run.role,
        "tokens": int(info.meta.get("tokens", 0)),
        "train_seconds": train_seconds(run.folder, run.cfg),
    }
    frames = None
    if run.role == "seed":
        prompts = dyck_seed_tables.in_context_prompts(words, model.cfg.max_seq_len)
        chosen_on = dyck_seed_tables.in_context_prompts(selection, model.cfg.max_seq_len)
        frames = dyck_case_frames(model, prompts, chosen_on)
    return rows, figures, frames


def dyck_case_frames(
    model: SmeltModel, prompts: Sequence[Any], selection: Sequence[Any]
) -> dict[str, pd.DataFrame]:
    """The case study's figures of `model` on in-context Dyck prompts: the case_study probe's
    mass tables, reduced per checkpoint by commands.case_seed_tables, the tracked heads chosen
    on the `selection` prompts (words of the other held-out draw, none of them reported)."""
    tables = case_tables.mass_tables(group_masses.dyck_masses(model, prompts), model.schedule)
    chosen = case_tables.mass_tables(group_masses.dyck_masses(model, selection), model.schedule)
    return case_seed_tables.checkpoint_figures(tables, chosen)


def validation_words(base: TrainConfig, n_words: int) -> int:
    """How many validation words the test draw is kept apart from: the seeds command's own
    validation draw of `n_words`, and the words the trainer's periodic evaluation scores (its
    examples with their demonstrations), whichever is more."""
    return max(n_words, base.eval.dyck_n * (base.eval.dyck_demos + 1))


def dyck_words(base: TrainConfig, spec: DyckSpec, n_words: int, draw: str) -> list[DyckExample]:
    """The held-out words the Dyck report scores: `n_words` of the named draw of `spec`."""
    apart = validation_words(base, n_words)
    return dyck_seed_tables.heldout_words(n_words, spec, draw, apart_from=apart)


def selection_words(base: TrainConfig, spec: DyckSpec, n_words: int, draw: str) -> list[Any]:
    """The words the case study's tracked heads are chosen on: `n_words` of the other held-out
    draw (the validation draw when the test draw is reported), so no chosen-on word is reported:
    the test draw shares no word with the validation draw's first validation_words."""
    other = VALIDATION if draw == TEST else TEST
    return dyck_words(base, spec, n_words, other)


def dyck_report(
    runs: Sequence[SeedRun], spec: DyckSpec, base: TrainConfig, n_words: int, draw: str
) -> tuple[dict[str, Any], str]:
    training = base.corpus.dyck
    words = dyck_words(base, spec, n_words, draw)
    selection = selection_words(base, spec, n_words, draw)
    rows, figures, parts = [], [], []
    for run in runs:
        by_depth, run_figures, frames = dyck_run(run, words, selection)
        rows += [row | {"role": run.role} for row in by_depth]
        figures.append(run_figures)
        if frames is not None:
            parts.append(({"seed": run.cfg.seed, "model": run.cfg.arch}, frames))
    table = pd.DataFrame(rows)
    per_seed = table[table["role"] == "seed"].drop(columns="role")
    rounding = table[table["role"] == "rounding"].drop(columns="role")
    run_table = pd.DataFrame(figures)
    summary = dyck_seed_tables.summarize(per_seed)
    payload = {
        "task": DYCK,
        "n_words": n_words,
        "draw": draw,
        "draw_apart_from": validation_words(base, n_words) if draw == TEST else None,
        "dyck": dataclasses.asdict(spec),
        "training_dyck": dataclasses.asdict(training),
        "words_seed": dyck_seed_tables.WORDS_SEED,
        "tracked_head_chosen_on": f"prompts of {n_words} words of the "
        f"{VALIDATION if draw == TEST else TEST} draw (none reported); the head per seed is "
        "visit_pairs' *_same_head",
        "over_seeds": summary.to_dict("records"),
        "targets": dyck_seed_tables.targets(per_seed).to_dict("records"),
        "per_seed": per_seed.to_dict("records"),
        "runs": figures,
    }
    if len(rounding):
        check = dyck_seed_tables.rounding_check(per_seed, rounding)
        payload["rounding"] = check.to_dict("records")
        spread = dyck_seed_tables.rounding_spread(per_seed, rounding)
        payload["rounding_spread"] = spread.to_dict("records")
    case_frames = stack_frames(parts)
    case_summary = case_seed_tables.summarize(case_frames)
    payload["case_study"] = {
        "probe": case_study.PROBE.name,
        "over_seeds": {
            JSON_NAMES[name]: df.to_dict("records") for name, df in case_summary.items()
        },
        "per_seed": {JSON_NAMES[name]: df.to_dict("records") for name, df in case_frames.items()},
    }
    text = dyck_seed_tables.markdown(
        per_seed, run_table, rounding, list(PAIR), spec, training, draw
    )
    demos = dyck_seed_tables.CASE_DEMOS
    n_prompts = len(dyck_seed_tables.in_context_prompts(words, base.model.max_seq_len))
    case_parts = [
        f"## Case study on {n_prompts:,} in-context prompts of the same words ({draw} draw)",
        "The case_study probe's masses (probes.case_study) on every seed's checkpoints. As the "
        f"paper poses in-context Dyck, each prompt is a query after {demos} solved "
        f"demonstrations: the {len(words):,} words scored above, taken {demos + 1} at a time in "
        f"order, the groups that fit the models' {base.model.max_seq_len} tokens kept "
        f"({n_prompts:,} of {len(words) // (demos + 1):,}). BOS mass and demonstration-answer "
        "mass at the query's answer positions are the paper's quantities.",
        *case_seed_tables.over_seed_parts(case_summary, case_frames, "the prompts"),
        "Per seed: value [95% bootstrap interval over prompts]; the best head's index in brackets.",
        case_seed_tables.per_seed_part(case_frames["visits"]),
    ]
    return payload, text + "\n" + "\n\n".join(case_parts) + "\n"


def json_frames(frames: dict[str, pd.DataFrame]) -> dict[str, list[dict[str, Any]]]:
    """Frames as JSON records, under their JSON_NAMES (other names kept)."""
    return {JSON_NAMES.get(name, name): df.to_dict("records") for name, df in frames.items()}


def stack_frames(parts: Sequence[tuple[dict[str, Any], dict[str, pd.DataFrame]]]) -> dict:
    """{name: one frame} of each checkpoint's case-study frames, headed by its seed and model
    (the `who` of each part)."""
    out: dict[str, pd.DataFrame] = {}
    for name in parts[0][1]:
        frame = pd.concat([f[name].assign(**who) for who, f in parts], ignore_index=True)
        out[name] = frame[["seed", "model", *[c for c in frame if c not in ("seed", "model")]]]
    return out


def recall_report(runs: Sequence[SeedRun], args: Any) -> tuple[dict[str, Any], str]:
    parts, models = [], []
    for run in runs:
        frames, figures = probe_run(run.folder, run.cfg, args.n_rows, args.seq_len)
        who = {"seed": run.cfg.seed, "model": run.cfg.arch}
        parts.append((who, frames))
        models.append(who | figures)
    per_seed = stack_frames(parts)
    per_model = pd.DataFrame(models)
    summary = recall_seed_tables.summarize(per_seed, per_model)
    payload = {
        "task": RECALL,
        "probe": case_study.PROBE.name,
        "n_rows": args.n_rows,
        "tracked_head_chosen_on": f"{args.n_rows} held-out rows of stream {SELECTION_SEED} (the "
        f"reported rows are stream {REPORT_SEED}; none shared); the head per seed is "
        "visit_pairs' *_same_head",
        "over_seeds": json_frames(summary),
        "per_seed": json_frames(per_seed) | {"by_model": models},
    }
    return payload, recall_seed_tables.markdown(summary, per_seed, per_model)
