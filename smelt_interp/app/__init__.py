"""The Dash dashboard (python -m smelt_interp.app): pages for the models' budgets, attention
patterns, routing, visit similarity and residual writes, and the Dyck case study. Computation
lives in the probes and the model; the app caches their results and arranges them into the
figures of smelt_interp.figures."""
