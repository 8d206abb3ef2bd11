"""A request's path from where it is asked to its arithmetic (tests/helpers/reader_path.py)
climbs back up a layer at most twice: the dashboard's case-study aggregate and the sink probe
on a transformers folder, each followed through every function a reader would open. The
helper is checked on a hand-built path first, so that a path that climbs is seen to climb."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from helpers.reader_path import RANK, Stop, climbs, reader_path
from helpers.tiny_looped import tiny_folder

from smelt_interp.app.pages.case_study import aggregate
from smelt_interp.app.registry import ModelRegistry
from smelt_interp.app.served import Served
from smelt_interp.data.dyck_draws import VALIDATION
from smelt_interp.probes import sink
from smelt_interp.probes.cli import probe_main
from smelt_interp.probes.inputs import ProbeRequest

MOST_CLIMBS = 2


STAND_IN = """
from smelt_interp.measure import case_heads


def helper(heads):
    return case_heads.same_head_diff(heads)

def page_with_helper(heads):
    case_heads.head_summary(heads)
    helper(heads)

def page_direct(heads):
    case_heads.head_summary(heads)
    case_heads.same_head_diff(heads)
"""


def test_a_caller_that_carries_the_number_on_is_a_climb():
    """A stand-in page (code run as a module of app/) that asks measure/ twice, the second
    time through a page helper met only after the first answer: the helper is a climb (app
    after measure); asking measure/ directly twice is not."""
    page: dict = {"__name__": "smelt_interp.app.stand_in"}
    exec(compile(STAND_IN, "stand_in.py", "exec"), page)
    heads = pd.DataFrame(
        {"layer": [1, 1], "visit": [0, 0], "depth": [1, 1], "head": [0, 1]}
        | {"bos_mass": [0.2, 0.6], "demo_mass": [0.5, 0.1]}
    )
    path = reader_path(lambda: page["page_with_helper"](heads))
    assert [s.rank for s in path] == [RANK["app"], RANK["measure"], RANK["app"], RANK["measure"]]
    assert [(a.where, b.where) for a, b in climbs(path)] == [
        ("measure.case_heads:head_summary", "app.stand_in:helper")
    ]
    path = reader_path(lambda: page["page_direct"](heads))
    assert [s.rank for s in path] == [RANK["app"], RANK["measure"]]
    assert climbs(path) == []


def test_climbs_are_read_from_ranks():
    stops = [Stop(0, "a"), Stop(3, "b"), Stop(7, "c"), Stop(3, "d"), Stop(0, "e")]
    assert climbs(stops) == [(stops[2], stops[3]), (stops[3], stops[4])]


def test_the_dashboard_case_study_climbs_at_most_twice(make_cfg, make_model):
    pair = {
        "baseline": make_model(make_cfg(looped=False, max_seq_len=128)),
        "smelt": make_model(make_cfg(looped=True, max_seq_len=128), seed=1),
    }
    request = ProbeRequest(n_seqs=2, demos=(0, 2), draw=VALIDATION)
    served = Served(ModelRegistry.from_models(pair), probe_request=request)
    path = reader_path(lambda: aggregate.aggregate(served, "dyck", None))
    assert path[0].where.startswith("app.pages.case_study.aggregate:")
    assert any(s.where.startswith("probes.case_study:run") for s in path)
    assert len(climbs(path)) <= MOST_CLIMBS, path


def test_the_sink_probe_on_a_transformers_folder_climbs_at_most_twice(tmp_path: Path, capsys):
    torch.manual_seed(0)
    folder = tiny_folder(tmp_path, "dory")  # no tokenizer: the probe reads a row of ids
    ids = ",".join(map(str, range(1, 30)))
    path = reader_path(lambda: probe_main(sink.PROBE, [str(folder), "--prompt-ids", ids]))
    assert "sink mass" in capsys.readouterr().out
    assert path[0].where.startswith("probes.cli:")
    assert any(s.rank == RANK["measure"] for s in path)
    assert len(climbs(path)) <= MOST_CLIMBS, path
