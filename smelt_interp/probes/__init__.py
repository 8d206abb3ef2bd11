"""Probes of looped MoE transformers (docs/design.md, "Probes"): one module per probe, each with
a `measure(model, ...)` returning a tidy pandas DataFrame, a `PROBE` spec (registry.ProbeSpec:
its tables, figures and summary beside the paper's values) and a command line
(`python -m smelt_interp.probes.<name> ckpt.pt`, the same as `python -m smelt_interp.probes
<name> ckpt.pt`). `python -m smelt_interp.report` runs them all.

    sink        attention-sink mass per layer, visit, head
    routing     expert-routing overlap between visits, with chance from expert usage
    similarity  Q/K/V cosine and top-8 attended-key overlap between visits, with control
    residual    attention / MoE write norms per visit, absolute and relative
    case_study  in-context case study (Dyck or associative recall): BOS, demonstration-answer,
                previous-token and other mass per visit; non-answer BOS mass; accuracy; Sink^0.3
    lens        logit lens by effective depth: CE and Dyck accuracy
    dla         direct logit attribution of each visit's attention and MoE writes
    head_ablation  mean-ablation of the case study's retrieval and parked heads on recall rows
    linear_probe   logistic probe of the computed-recall class at each visit's input
    interventions  nnsight edits: remove a visit's attention to BOS, patch one visit into another
    patching    activation, attribution, path and cross-visit patching per (layer, visit, head)

`computed_recall` (the tracked head on computed-recall rows, chosen on validation rows) runs by
module and is not registered: the computed-recall study's command
(smelt_interp.commands.computed_seeds) runs it.

Support: `registry` (the spec and the list of probes), `common` (batches, caching, depth index),
`inputs` (what probes run on), `metrics` (answer positions, cross-entropy, teacher-forced Dyck
scoring), `session` (inputs built and a probe run on models opened by smelt_interp.loading, for
the command line and the dashboard alike), `cli` (the shared command line) and `__main__`
(`python -m smelt_interp.probes NAME`, any registered probe by name). Every attention statistic
(masses, chance levels, overlaps; from cached Q and K in query chunks, so no probe needs the
[heads, T, T] pattern) is asked of smelt_interp.measure, shared with the trainer; intervals are
measure.intervals.

Adding a probe takes three edits:

1. a module `smelt_interp/probes/<name>.py` with `run(model, inputs, opts) -> {table: df}`,
   `summarize(tables) -> summary([...])` (paper values from smelt_interp.paper) and
   `PROBE = ProbeSpec(name, description, run, summarize, tables=(...), figures=(...))`,
   ending in
       if __name__ == "__main__":
           from smelt_interp.probes.cli import run_probe_command

           run_probe_command(PROBE)
   A figure is `FigureSpec(kind, table, title, y=...)`; kind "by_depth" draws column `y` of a
   per-(layer, visit, depth) table with no figures edit (bespoke kinds live in
   smelt_interp.figures.probes.RENDERERS);
2. its name in `registry.BUILTIN`. A probe outside the package needs no edit here: an installed
   package names it in an entry point of group `smelt_interp.probes` (`name =
   "package.module:PROBE"`), code calls `registry.register(PROBE)`, and `python -m
   smelt_interp.probes package.module:PROBE ckpt.pt` runs one from any importable module;
3. a test file `tests/test_probes_<name>.py`.

The report, the notebooks and the dashboard then show it: they loop over
`registry.registered()`."""
