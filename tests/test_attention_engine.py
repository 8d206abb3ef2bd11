"""measure/ is the one engine for attention statistics: no function outside smelt_interp/measure
reduces attention. The AST check of tests/helpers/attention_guard.py follows, through each
function, every value that holds attention (rows, patterns, first-key columns, masses and their
sums, uniform attention's sums, an accumulator fed any of them) and flags any sum, mean, einsum,
matmul or division of one, in any spelling (`x.sum(`, `torch.sum(x)`, `np.mean(x)`, `sum(x)`,
`x += ...`, `sums / counts`, `acc.mean(key)`), a chance level written as a division by x + 1,
and a BOS column read off attention weights.

Left out: the model's own attention (model/, adapters/: where attention is computed, not
measured) and the budget's parameter and FLOP counts (budget/, whose `attention` is a count).
The check is shown to catch every place that reduced attention outside measure/ before the
statistics moved in (the planted cases are those functions as they were), and to pass the
same numbers asked of measure/."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.attention_guard import violations

import smelt_interp

PACKAGE = Path(smelt_interp.__file__).parent
ENGINE = PACKAGE / "measure"
EXEMPT = ("measure", "model", "adapters", "budget")


def _checked() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in EXEMPT)


def test_no_module_outside_measure_reduces_attention():
    found = []
    for path in _checked():
        found += violations(path.read_text(), str(path.relative_to(PACKAGE)))
    assert not found, "ask smelt_interp.measure instead:\n" + "\n".join(found)


def test_the_engine_itself_is_what_the_check_sees():
    """The check is not blind: measure/ holds the statistics, so run over it, it finds them."""
    found = [v for p in sorted(ENGINE.rglob("*.py")) for v in violations(p.read_text(), p.name)]
    for what in ("chance level", "BOS column", "attention reduction", "arithmetic on attention"):
        assert any(what in v for v in found), what


# Each function outside measure/ that reduced attention before the statistics moved in, as it
# was (trimmed to the lines that did it), then a few spellings of the same arithmetic.
PLANTED = {
    # probes/sink.py: per-head BOS, window and slot sums, divided by counts in an Accumulator
    "sink_measure": """
def sink_measure(model, mb, cache, source, hidden, chunk, acc, layer, visit):
    rows_of = visit_rows(source, cache, layer, visit, hidden.get(layer))
    first, slot = first_key_columns(rows_of, mb.valid, chunk)
    column = first.sum(dim=0)
    acc.add((layer, visit), column.sum(dim=-1), n_queries)
    acc.add((layer, visit, "slot"), slot.sum(dim=(0, 2)), n_queries)
    return acc.mean((layer, visit))
""",
    # train/case_eval.py: per-head masses of the periodic evaluation
    "heldout_case": """
def heldout_case(cache, model, groups, n_groups, case, hidden, answer):
    sums = visit_masses(cache, model.schedule, groups, n_groups, case.key_sets(), hidden=hidden)
    counts = group_counts(groups, n_groups).sum(dim=0)
    bos = sums[:, :, -1, :, 0].sum(dim=0) / counts[-1]
    return bos, sums[:, :, answer].sum(dim=(0, 2)) / counts[answer].sum()
""",
    # probes/case_study.py: Sink^0.3's per-row window sums
    "sink_table": """
def sink_table(model, tokens, valid):
    sums, counts = [], []
    for row in range(tokens.shape[0]):
        s, c = bos_column_sums(model, tokens[row : row + 1], valid[row : row + 1])
        sums.append(s.sum(dim=-1).numpy())
        counts.append(float(c.sum()))
    return sums, counts
""",
    # probes/case_tables.py (now measure/): the pooled chance level, written a second time
    "_uniform": """
def _uniform(m):
    level = m.reference.sum(axis=0) / m.counts.sum()
    return {stat: float(level[s]) for s, stat in enumerate(STATS)}
""",
    # probes/head_ablation.py: per-head demonstration and BOS masses
    "head_masses": """
def head_masses(model, rows, trigger_ids, answer, n_answer):
    masses = recall_masses(model, rows, trigger_ids)
    return masses.sums[:, :, answer, :, 1].sum(axis=(0, 2)) / n_answer
""",
    # app/prompt_run.py: the learned-sink slot share, written a second time
    "slot_share": """
def slot_share(self, layer, visit):
    weights = self.pattern(layer, visit).astype(np.float64)
    queries = weights[:, 1:] if weights.shape[1] > 1 else weights
    return (1.0 - queries.sum(axis=-1)).mean(axis=1)
""",
    # app/pattern_cap.py: BOS share from the BOS columns
    "bos_share": """
def bos_share(self, q, k, valid, step, hidden, t):
    column = bos_columns(q, k, valid, step, hidden)[0]
    return column.sum(dim=1).numpy() / (t - 1)
""",
    # probes/similarity.py: per-head top-k overlap summed over rows
    "similarity": """
def similarity(rows_a, rows_b, valid, top, chunk, acc, key):
    overlap = topk_overlap_rows(rows_a, rows_b, valid, top, chunk)
    acc.add(key, overlap.sum(dim=0), overlap_count(valid, top))
""",
    # probes/interventions.py: rows renormalised after BOS is cut
    "without_bos": """
def without_bos(pattern):
    edited = pattern.clone()
    rest = edited.sum(dim=-1, keepdim=True)
    return edited / rest
""",
    # the other spellings: torch.sum, np.mean, einsum, matmul, sum(), +=, a chance level
    "spellings": """
def spellings(q, k, pos, keys, uniform_sums, n):
    rows = attention_rows(q, k, pos)
    a = torch.sum(rows, dim=-1)
    b = np.mean(rows.numpy(), axis=1)
    c = torch.einsum("bhqk,bqk->bh", rows, keys)
    d = rows @ keys
    e = sum(r for r in rows)
    total = 0.0
    for chunk in row_chunks(lambda p, m: rows, 4):
        total += chunk[1]
    return a, b, c, d, e, total, 1.0 / (n + 1)
""",
    "bos_column": """
def bos_column(p):
    return p[:, 1:, 0]
""",
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_reduction_is_caught(name):
    found = violations(PLANTED[name])
    assert found and all(f" {name}: " in v for v in found), found


def test_every_spelling_is_caught():
    found = "\n".join(violations(PLANTED["spellings"]))
    for spelled in (
        "torch.sum",
        "np.mean",
        "torch.einsum",
        "rows @",
        "sum(...)",
        "total +=",
        "x + 1",
    ):
        assert spelled in found, spelled


def test_statistics_asked_of_measure_pass():
    """Reading measure's results, summarising a results table and counting are not flagged."""
    asked = """
def view(run, lengths, heads, model, tokens):
    bos, slot = first_key_shares(run.rows(0, 0), run.n_tokens)
    masses = sink_masses(model, tokens)
    share = heads["sink_mass"].mean()
    n = len(lengths) / 2
    hits = (logits.argmax(-1) == targets).double().mean()
    return bos, slot, masses.frame(), share, n, hits, uniform_bos(lengths)
"""
    assert violations(asked) == []
