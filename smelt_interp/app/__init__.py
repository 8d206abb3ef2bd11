"""The Dash dashboard (python -m smelt_interp.app): pages for the models' budgets, attention
patterns, routing, visit similarity and residual writes, and the Dyck case study. Computation
lives in the probes and the model; the app caches their results and arranges them into the
figures of smelt_interp.figures.

    __main__    the command line: which checkpoints to serve, on which address
    registry    the models it may open (only those named on the command line), loaded
                when their checkpoints appear and reloaded when they are replaced
    served      what the server holds between requests: the models and one cache per kind
                of result (data only), and the facts about the served models pages share
    prompt_run  one prompt's forward pass, cached per (model, version, prompt)
    default_prompts  the prompt a page opens on for a model (its own task's held-out example)
    probe_tables  the registered probes' tables (spec.run on the report's inputs, cached per
                (probe, model, inputs); no Dash here)
    server      create_app: Dash's pages mechanism, the nav bar, the assets folder
    value_kinds the kinds of value a control may send (a page declares each control's)
    guarded     every callback's inputs checked by their declared kinds, errors answered
                with the page's message (never HTTP 500)
    http_hardening  requests for other hosts refused, callback bodies capped and checked in
                shape against Dash's callback keys (the Dash versions pinned in pyproject)
    pages/      one module per page: its controls, its probes, its layout, its callbacks and
                the cached views only it draws (the case study a package of its views, each
                owning those for its part); beside them what a single page needs
                (pattern_cap for Attention, run_watch for Runs, probe_section for the cards
                of probes no page names)
    controls    a page's controls declared once (id, property, kind, URL key)
    pending     the progress of runs whose checkpoints are still to come, on every page
    urls        a page's state in the URL query string
    components  layout pieces the pages share
    jobs, keeper  the demo pairs trained in the background, and the keeper that ends the
                trainer when the dashboard goes away
    lru, figure_cache  the thread-safe LRU under every cache; finished callback answers
                shared between users
    assets/     the CSS and client-side JavaScript Dash serves with every page
"""
