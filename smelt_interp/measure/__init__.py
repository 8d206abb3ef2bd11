"""Measurements: the statistics every part computes over attention, positions, answers and runs,
each defined once, so the trainer's evaluation, the probes, the analyses, the commands and the
dashboard report the same numbers. No module outside this package defines a function that
computes an attention mass or a chance level (tests/test_attention_engine.py checks it).

    batching        batches on the model's device, micro-batches, capture of hooks, pooled sums
    attention_stats attention rows from cached Q and K a chunk of queries at a time; top-k overlap
    sink            BOS attention mass per (layer, visit, head) and Sink^0.3
    position_mass   attention mass of per-query position sets over per-query key sets
    levels          chance levels: what uniform attention would put on a key set
    case_positions  the case study's position and key sets for both of its tasks
    group_masses    the case study's masses per row and position group, from one pass per batch
    case_heads      the case study's per-head tables summarised: head means, best heads, visit pairs
    dyck_score      scoring a model's Dyck answers (greedy and teacher-forced exact match)
    intervals       Wilson, Student-t and percentile-bootstrap intervals
    seeds           statistics summarised over training seeds
    provenance      what a checkpoint was trained on: its task, the task's spec, its run folder
"""
