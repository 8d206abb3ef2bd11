"""The dashboard's pages, in nav-bar order. Each module has PATH, TITLE, PROBES (the registered
probes whose tables it draws, from app.probe_tables), CONTROLS (its controls, declared once:
see smelt_interp.app.controls), QUERY and INPUTS derived from them, `layout(served, state)` (the
page for a decoded URL state; `served`, the app.served state) and `register(app, served)` (its
callbacks, kept thin: they fetch cached results through the functions of app.prompt_run and
app.probe_tables, hand them to the figure functions and write the page's keys back to the
URL). smelt_interp.app.server registers them with Dash's pages mechanism.

Which page shows which probe is the app's choice, written here and in each page's PROBES: a
registered probe no page names (one written by a user, say) gets a card with its spec's
figures on OTHER_PROBES_PAGE, except those in REPORT_ONLY, which only the report draws."""

from smelt_interp.app.pages import (
    attention,
    case_study,
    overview,
    patching,
    routing,
    runs,
    similarity,
)

PAGES = (overview, attention, routing, similarity, case_study, patching, runs)
OTHER_PROBES_PAGE = overview
# the logit lens and direct logit attribution: tables per depth the report prints and draws;
# the head ablation: runs on a recall checkpoint's rows, which the report prints; the linear
# probe: fits logistic regressions on computed-recall rows, which the report prints and draws
REPORT_ONLY = ("lens", "dla", "head_ablation", "linear_probe")
