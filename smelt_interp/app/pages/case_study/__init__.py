"""The case-study page, a package of its views (being split out of recall.py)."""

from smelt_interp.app.pages.case_study.recall import *  # noqa: F403
