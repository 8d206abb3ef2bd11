"""Probes of looped MoE transformers (DESIGN.md, "Probes"): one module per probe, each with a
`measure(model, ...)` returning a tidy pandas DataFrame and a command line
(`python -m smelt_interp.probes.<name> ckpt.pt`). `report` runs them all.

    sink        attention-sink mass per layer, visit, head
    routing     expert-routing overlap between visits, with chance k^2/E; expert usage
    similarity  Q/K/V cosine and top-8 attended-key overlap between visits, with control
    residual    attention / MoE write norms per visit, absolute and relative
    dyck        Dyck in-context case study: BOS vs demonstration mass per visit; accuracy
    lens        logit lens by effective depth: CE and Dyck accuracy
    interventions  nnsight edits: remove a visit's attention to BOS, patch one visit into another

Attention statistics come from cached post-RoPE Q and K in query chunks (attention_stats), so
no probe needs the [heads, T, T] pattern."""
