"""The Dash dashboard (python -m smelt_interp.app): pages for the models' budgets, attention
patterns, routing, visit similarity and residual writes, and the Dyck case study. Computation
lives in the probes and the model; the app caches their results and arranges them into the
figures of smelt_interp.figures.

    __main__    the command line: which checkpoints to serve, on which address
    registry    the models it may open (only those named on the command line), loaded
                when their checkpoints appear and reloaded when they are replaced
    compute     the Workbench: cached forward passes and the registered probes' tables
                (spec.run on the report's inputs; no Dash here)
    server      create_app: Dash's pages mechanism, the nav bar, the assets folder
    value_kinds the kinds of value a control may send (a page declares each control's)
    guarded     every callback's inputs checked by their declared kinds, errors answered
                with the page's message (never HTTP 500)
    http_hardening  requests for other hosts refused, callback bodies capped and checked in
                shape against Dash's callback keys (the Dash versions pinned in pyproject)
    pages/      one module per page: its controls, its probes, its layout and its callbacks
                (the case study a package of its views, each owning those for its part)
    pattern_cap what one response may carry of an attention pattern: long ones as block means
    controls    a page's controls declared once (id, property, kind, URL key)
    pending     the progress of runs whose checkpoints are still to come, on every page
    probe_section  cards for registered probes no page names
    urls        a page's state in the URL query string
    components  layout pieces the pages share
    assets/     the CSS and client-side JavaScript Dash serves with every page
"""
