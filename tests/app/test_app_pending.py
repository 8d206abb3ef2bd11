"""Pages of a run that is not ready: a served run folder whose checkpoint does not exist yet is
pending (found, not an error), every page shows its progress and ETA, the page's poll asks for
a reload once the checkpoint appears, and a checkpoint replaced while the app runs (a resumed
run) is reloaded and computed afresh, never served from the old one's cache."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from dash import page_registry

from smelt_interp.app import pending
from smelt_interp.app.probe_tables import model_tables
from smelt_interp.app.prompt_run import cached_run
from smelt_interp.app.registry import ModelRegistry, find_checkpoints
from smelt_interp.app.served import Served
from smelt_interp.app.server import create_app
from smelt_interp.checkpoint import save_checkpoint
from smelt_interp.errors import CheckpointError
from smelt_interp.measure.attention_stats import pattern
from smelt_interp.train.progress import write_job


def texts(component) -> str:
    """All the text of a layout, joined."""
    out = []
    for c in component._traverse():
        children = getattr(c, "children", None)
        if isinstance(children, str):
            out.append(children)
    return " ".join(out)


def post(app, output: str, inputs: list[dict], state: list[dict]) -> dict:
    """One callback request through the app's server, as the browser sends it."""
    ids = [
        {"id": part.rsplit(".", 1)[0], "property": part.rsplit(".", 1)[1]}
        for part in output.strip(".").split("...")
    ]
    body = {
        "output": output,
        "outputs": ids,
        "inputs": inputs,
        "changedPropIds": [],
        "state": state,
    }
    response = app.server.test_client().post("/_dash-update-component", json=body)
    assert response.status_code in (200, 204), response.get_data(as_text=True)[:300]
    return response.get_json()["response"] if response.status_code == 200 else {}


@pytest.fixture
def training_run(tmp_path):
    """A run folder as the trainer leaves it before its first checkpoint: two train records
    in metrics.jsonl and a running job of 10 steps (this process stands in for the trainer)."""
    run = tmp_path / "pair" / "smelt"
    run.mkdir(parents=True)
    records = [
        {"event": "train", "step": s, "tokens": 100 * s, "tokens_per_s": 50.0} for s in (1, 2)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_job(run, state="running", pid=os.getpid(), steps=10)
    return run


def test_a_run_without_a_checkpoint_is_pending_and_its_pages_show_progress(
    training_run, make_cfg, make_model
):
    found = find_checkpoints([training_run.parent])
    assert found == {"smelt": training_run / "ckpt.pt"}
    registry = ModelRegistry(found)
    assert registry.names == []
    [(name, progress)] = registry.pending()
    assert (name, progress.state, progress.step, progress.steps) == ("smelt", "training", 2, 10)
    # 8 steps left at 100 tokens a step and 50 tokens/s: 16 s
    assert progress.eta_s == pytest.approx(16.0)

    wb = Served(registry)
    app = create_app(wb)
    pages = {p["path"]: p["layout"] for p in page_registry.values()}
    for path in ("/", "/attention", "/routing", "/similarity", "/case-study"):
        shown = texts(pages[path]())
        assert "step 2 of 10 (20%)" in shown and "ETA 16 s" in shown, path
        assert "Waiting for the first checkpoint" in shown

    poll = f"..{pending.BODY}.children...{pending.RELOAD}.data.."
    ticks = [{"id": pending.CONTROLS.id("poll"), "property": "n_intervals", "value": 1}]
    served = [{"id": pending.CONTROLS.id("served"), "property": "data", "value": []}]
    answer = post(app, poll, ticks, served)
    assert "step 2 of 10" in json.dumps(answer[pending.BODY]) and pending.RELOAD not in answer

    model = make_model(make_cfg(looped=True, max_seq_len=128), seed=1)
    save_checkpoint(training_run / "ckpt.pt", model)  # the trainer's first checkpoint
    assert post(app, poll, ticks, served)[pending.RELOAD] == {"data": True}  # the page reloads
    assert registry.names == ["smelt"] and registry.pending() == []
    assert "Focused head" in texts(pages["/attention"]())


def test_a_replaced_checkpoint_is_reloaded_not_served_stale(training_run, make_cfg, make_model):
    cfg = make_cfg(looped=True, max_seq_len=128)
    first, second = make_model(cfg, seed=1), make_model(cfg, seed=2)
    path = save_checkpoint(training_run / "ckpt.pt", first, step=5)
    registry = ModelRegistry(find_checkpoints([training_run.parent]))
    wb = Served(registry)
    version = registry.version("smelt")
    before = cached_run(wb, "smelt", "( [ ] )").pattern(1, 1)
    assert cached_run(wb, "smelt", "( [ ] )").pattern(1, 1) is before  # cached

    save_checkpoint(path, second, step=9)  # a resumed run writes its next checkpoint
    assert registry.version("smelt") == version + 1 and registry.info("smelt").step == 9
    after = cached_run(wb, "smelt", "( [ ] )")
    reference = _pattern(second, after.ids, 1, 1)
    assert np.allclose(after.pattern(1, 1), reference, atol=1e-6)
    assert not np.allclose(after.pattern(1, 1), before, atol=1e-4)
    sink = model_tables(wb, "sink", "smelt")
    assert model_tables(wb, "sink", "smelt") is sink and wb.table_cache.misses == 1

    # a half-written file keeps the last good model until the file changes again
    path.write_bytes(path.read_bytes()[:100])
    assert registry.get("smelt") is registry.get("smelt")
    assert registry.version("smelt") == version + 1


def test_a_missing_checkpoint_outside_a_run_is_still_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="no run writing it"):
        ModelRegistry({"smelt": tmp_path / "smelt" / "ckpt.pt"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no ckpt.pt"):
        find_checkpoints([tmp_path / "empty"])


def _pattern(model, ids: list[int], layer: int, visit: int) -> np.ndarray:
    """Attention of every head of (layer, visit), straight from the model's hook points."""
    from smelt_interp.measure.batching import capture
    from smelt_interp.model.protocol import hook_name

    names = [hook_name(layer, visit, "attn.hook_q"), hook_name(layer, visit, "attn.hook_k")]
    _, cache = capture(model, torch.tensor([ids]), names)
    return pattern(cache[names[0]], cache[names[1]])[0].numpy()
