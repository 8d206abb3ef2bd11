"""The case study's numbers go from rows to result inside measure/: once the probe hands its
prompts to the measurement layer, no call climbs back into probes/ (or above) to carry on the
arithmetic, and the only climbs left are measure/ resuming after the data helpers it calls
(Dyck batches, token sets). Followed with a profiler: every call into another module's
function of the layers app .. data (and every call within a probe module), the model's forward
left out, in execution order."""

from __future__ import annotations

import sys

import torch
from conftest import TINY_FIELDS

from smelt_interp.config import ModelConfig
from smelt_interp.data.dyck_draws import VALIDATION
from smelt_interp.model.transformer import SmeltModel
from smelt_interp.probes import case_study
from smelt_interp.probes.inputs import ProbeInputs
from smelt_interp.probes.registry import ProbeOptions

RANK = {"app": 0, "commands": 0, "report": 0, "figures": 1, "probes": 2, "train": 2}
RANK |= {"analysis": 2, "measure": 3, "loading": 4, "data": 5}


def layer_stops(run) -> list[tuple[int, str]]:
    """(layer rank, module) of each call into another module's function while `run()` runs,
    consecutive calls into one layer merged."""
    stops: list[tuple[int, str]] = []

    def profile(frame, event, arg) -> None:
        module = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        name = frame.f_code.co_name
        parts = module.split(".")
        # a call within one module counts where the module sits above measure/: a probe's own
        # helper doing arithmetic after measure/ returned is a climb too
        inner = caller == module and not module.startswith("smelt_interp.probes")
        if event != "call" or inner or name.startswith(("<", "__")):
            return
        if parts[0] != "smelt_interp" or len(parts) < 2 or parts[1] not in RANK:
            return
        if not stops or stops[-1][0] != RANK[parts[1]]:
            stops.append((RANK[parts[1]], module))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return stops


def test_the_case_study_never_climbs_back_above_measure():
    torch.manual_seed(0)
    model = SmeltModel(ModelConfig.smelt(**(TINY_FIELDS | {"max_seq_len": 256}))).eval()
    inputs = ProbeInputs(
        n_seqs=1, seq_len=64, seed=3, demos=(1,), max_seq_len=256, task="dyck", draw=VALIDATION
    )
    inputs.dyck_examples()  # the prompts drawn before the measurement, as the dashboard's are
    stops = layer_stops(lambda: case_study.run(model, inputs, ProbeOptions(batch_size=2)))
    ranks = [rank for rank, _ in stops]
    start = ranks.index(RANK["measure"])
    assert all(rank >= RANK["measure"] for rank in ranks[start:]), stops
    climbs = [(a, b) for a, b in zip(stops[start:], stops[start + 1 :]) if b[0] < a[0]]
    assert all(a[0] == RANK["data"] and b[0] == RANK["measure"] for a, b in climbs), climbs
