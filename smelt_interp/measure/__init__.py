"""Measurements: the statistics every part computes over attention, positions, answers and runs,
each defined once, so the trainer's evaluation, the probes, the analyses, the commands and the
dashboard report the same numbers. No module outside this package reduces attention (no sum,
mean or division of rows, columns, masses or their sums; no chance level): they read the pooled
results measured here (tests/test_attention_engine.py checks it).

    batching        batches on the model's device, micro-batches, capture of hooks, pooled sums
    attention_stats attention rows from cached Q and K a chunk of queries at a time; top-k overlap
    sink            BOS (first-key) and learned-sink slot columns, one prompt's shares, the
                    pooled Sink^0.3
    sink_gu         Sink^0.3 as Gu et al. compute it: per sample, thresholded per row
    head_masses     attention statistics pooled per (layer, visit, head): the sink probe's result
    position_mass   attention mass of per-query position sets over per-query key sets
    levels          chance levels: what uniform attention would put on a key set
    chance          chance levels of overlaps: random top-k sets, routing from usage, shuffled
    case_positions  the case study's position and key sets for both of its tasks
    group_masses    the case study's masses per row and position group, from one pass per batch
    case_tables     the case study's mass tables pooled over rows with bootstrap intervals
    case_heads      the case study's per-head tables summarised: head means, best heads, visit pairs
    case_accuracy   the case study's accuracy at answer positions; computed-recall accuracy
    computed_case   the case study's position sets and masses on computed-class recall rows
    head_choice     the tracked head: the head whose mean ablation at visit 1 drops accuracy most
    linear_probe    logistic probes of a feature on each visit's residual, with their controls
    lm_loss         held-out next-token loss of any model the probes read
    depth_cache     a per-visit cache re-keyed by effective depth for TransformerLens's tools
    patching        activation and attribution patching per (layer, visit), head and position
    path_patching   path and cross-visit patching on (layer, visit, head) nodes
    patch_tables    the patching tables every reader shows, and their headline numbers
    dyck_score      scoring a model's Dyck answers (greedy and teacher-forced exact match)
    intervals       Wilson, Student-t and percentile-bootstrap intervals
    seeds           statistics summarised over training seeds
    seed_stats      exact tests over seeds, difference in differences, bootstrap coverage
"""
