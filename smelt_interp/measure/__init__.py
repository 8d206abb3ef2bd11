"""Measurements: the statistics every part computes over attention, positions, answers and runs,
each defined once, so the trainer's evaluation, the probes, the analyses, the commands and the
dashboard report the same numbers.

    sink            BOS attention mass per (layer, visit, head) and Sink^0.3
    position_mass   attention mass of per-query position sets over per-query key sets
    case_positions  the case study's position and key sets for both of its tasks
    dyck_score      scoring a model's Dyck answers (greedy and teacher-forced exact match)
    intervals       Wilson, Student-t and percentile-bootstrap intervals
    seeds           statistics summarised over training seeds
    provenance      what a checkpoint was trained on: its task, the task's spec, its run folder
"""
