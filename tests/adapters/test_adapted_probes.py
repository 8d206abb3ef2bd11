"""The probes on transformers' looped models, through the same code path as on SmeltModel: the
sink probe's BOS and learned-sink masses against the eager attention weights that the plain model
returns for every call (`output_attentions`, in execution order), the routing probe's overlap
against the router's own outputs, and every probe command on a model folder with --prompt-ids,
with its one-line refusals."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from helpers.tiny_looped import ARCHS, VOCAB, tiny_folder, tiny_model  # noqa: E402

from smelt_interp import ModelConfig, SmeltModel  # noqa: E402
from smelt_interp.adapters import adapt  # noqa: E402
from smelt_interp.errors import ProbeError, TokenError, TokenizerError  # noqa: E402
from smelt_interp.measure import position_mass  # noqa: E402
from smelt_interp.measure.depth_cache import run_with_depth_cache  # noqa: E402
from smelt_interp.model.protocol import hook_name  # noqa: E402
from smelt_interp.probes import registry, routing, sink  # noqa: E402
from smelt_interp.probes.cli import probe_main  # noqa: E402
from smelt_interp.probes.inputs import ProbeInputs  # noqa: E402
from smelt_interp.probes.registry import ProbeOptions  # noqa: E402

T = 14
ROW = ",".join(str(i) for i in [1, 5, 9, 13, 17, 21, 25, 29, 33, 2, 3, 4, 5, 6])


def _pair(arch: str):
    """(adapter, plain eager copy of the same weights)."""
    hf = tiny_model(arch)
    plain = copy.deepcopy(hf)
    plain.set_attn_implementation("eager")
    return adapt(hf), plain


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("looped")
    return {arch: tiny_folder(root, arch) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_sink_probe_equals_the_eager_weights_in_float64(arch):
    adapter, plain = _pair(arch)
    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (3, T))
    lengths = torch.tensor([T, T - 3, T - 6])
    heads = sink.measure(adapter, tokens, lengths, batch_size=2, chunk=5)
    # The plain model's weights of every attention call, in call order = the schedule's order.
    sums, slot_sums, count = defaultdict(float), defaultdict(float), 0
    for row, n in zip(tokens, lengths.tolist()):
        with torch.no_grad():
            calls = plain(row[None, :n], output_attentions=True).attentions
        assert len(calls) == len(adapter.schedule)
        count += n - 1
        for depth, weights in enumerate(calls):
            w = weights[0].double()  # [H, n, n]
            for h in range(w.shape[0]):
                sums[depth, h] += float(w[h, 1:, 0].sum())
                slot_sums[depth, h] += float((1 - w[h, 1:].sum(dim=-1)).sum())
    for row in heads.itertuples():
        assert row.sink_mass == pytest.approx(sums[row.depth, row.head] / count, abs=1e-6)
        if arch == "inkling2_loop":
            want = slot_sums[row.depth, row.head] / count
            assert row.sink_slot_mass == pytest.approx(want, abs=1e-6)
    assert set(heads["key0"]) == {"first token (the model adds no BOS)"}  # said in the table
    assert "first token" in sink.summarize({"heads": heads})["statistic"].iloc[0]
    if arch == "inkling2_loop":
        assert heads["sink_slot_mass"].max() > 0.05  # the learned sinks take a visible share
    else:
        assert "sink_slot_mass" not in heads


def test_routing_probe_equals_the_router_outputs():
    adapter, plain = _pair("inkling2_loop")
    routers = {
        i: layer.mlp.gate for i, layer in enumerate(plain.model.layers) if hasattr(layer, "mlp")
    }
    chosen: dict[int, list[torch.Tensor]] = defaultdict(list)
    for i, router in routers.items():
        router.register_forward_hook(lambda m, a, out, i=i: chosen[i].append(out[2]))
    torch.manual_seed(2)
    tokens = torch.randint(0, VOCAB, (2, T))
    with torch.no_grad():
        plain(tokens)
    table = routing.measure(adapter, tokens)
    assert len(table) > 0
    for row in table.itertuples():
        a, b = chosen[row.layer][row.visit], chosen[row.layer][row.other_visit]
        shared = (a[:, :, None] == b[:, None, :]).any(dim=-1).sum(dim=-1).double()
        assert row.overlap == pytest.approx(float(shared.mean()), abs=1e-9)
        assert row.n_experts == 8 and row.top_k == 2


@pytest.mark.parametrize("arch", ["dory", "inkling2_loop"])
def test_one_code_path_serves_both_kinds(arch, monkeypatch):
    """Every registered probe runs on a SmeltModel and an adapted model through the same
    functions; the attention statistics of both go through measure.visit_rows."""
    seen = []
    real = position_mass.visit_rows

    def spy(source, *args, **kwargs):
        seen.append(source)
        return real(source, *args, **kwargs)

    # the modules that read attention rows for these probes: the sink probe's pooling, similarity
    for module in ("measure.head_masses", "probes.similarity"):
        monkeypatch.setattr(f"smelt_interp.{module}.visit_rows", spy)
    adapter, _ = _pair(arch)
    smelt = SmeltModel(ModelConfig.smelt(n_layers=4, vocab_size=VOCAB, bos_token_id=1)).eval()
    ids = tuple(int(i) for i in ROW.split(","))
    for model in (smelt, adapter):
        inputs = ProbeInputs(prompt_ids=ids, max_seq_len=64)
        for name in ("sink", "similarity", "residual"):
            tables = registry.get(name).run(model, inputs, ProbeOptions(batch_size=2))
            main = next(iter(tables.values()))
            assert {"layer", "head"} <= set(main) or {"layer", "visit"} <= set(main)
    assert {"qk", "pattern"} <= set(seen)


@pytest.mark.parametrize("probe", ["sink", "similarity", "residual", "lens", "routing", "dla"])
@pytest.mark.parametrize("arch", ARCHS)
def test_probe_command_on_a_model_folder(folders, tmp_path, probe, arch, capsys):
    out = tmp_path / "out.json"
    argv = [str(folders[arch]), "--prompt-ids", ROW, "--json", str(out)]
    spec = registry.get(probe)
    if probe == "routing" and arch != "inkling2_loop":
        with pytest.raises(ProbeError, match="dense MLP"):
            probe_main(spec, argv)
        return
    if probe == "dla" and arch != "hrm_text":  # a head that is no plain norm and linear map
        with pytest.raises(ProbeError, match="readout does not reproduce"):
            probe_main(spec, argv)
        return
    assert probe_main(spec, argv) == 0
    payload = json.loads(out.read_text())
    (described,) = payload["models"].values()
    assert described["config"]["arch"].startswith(arch)
    assert payload["tokens"]["ids"][:3] == [1, 5, 9]
    main = payload["tables"][spec.tables[0]]
    assert main and "layer" in main[0]
    if probe == "sink":
        visits = {(r["layer"], r["visit"]) for r in main}
        assert len(visits) == len(described["schedule"])


def test_execution_order_views_of_an_adapted_model():
    """TransformerLens' tools over the depth aliases: the accumulated residual at the last depth,
    read out, is the model's logits, and its logit attribution is the logit (less the head's
    bias); every depth's entry is that visit's own resid_pre."""
    adapter, _ = _pair("hrm_text")
    torch.manual_seed(3)
    tokens = torch.randint(0, VOCAB, (2, T))
    with pytest.raises(ProbeError, match="one residual stream"):  # its stacks restart it
        run_with_depth_cache(adapter, tokens)
    logits, cache = run_with_depth_cache(adapter, tokens, check_stream=False)
    view = cache.model
    stack = cache.accumulated_resid(apply_ln=True)
    assert len(stack) == len(adapter.schedule) + 1
    assert torch.allclose(view.unembed(stack[-1]), logits, atol=1e-4)
    targets = tokens[:, 1:]
    last = cache.accumulated_resid(pos_slice=slice(0, -1))[-1:]
    attrs = cache.logit_attrs(last, targets, pos_slice=slice(0, -1))
    want = logits[:, :-1].gather(-1, targets[..., None])[..., 0] - view.b_U[targets]
    assert torch.allclose(attrs[0], want, atol=1e-4)
    raw = cache.accumulated_resid()
    _, per_visit = adapter.run_with_cache(tokens)
    for d, (layer, visit) in enumerate(adapter.schedule):
        assert torch.equal(raw[d], per_visit[hook_name(layer, visit, "hook_resid_pre")])


def test_prompt_ids_refusals(folders):
    spec = registry.get("sink")
    folder = str(folders["dory"])
    with pytest.raises(TokenError, match="0..63"):
        probe_main(spec, [folder, "--prompt-ids", f"1,2,{VOCAB}"])
    with pytest.raises(TokenizerError, match="--prompt-ids"):
        probe_main(spec, [folder, "--prompt", "no tokenizer here"])
    with pytest.raises(ProbeError, match="allows 64"):
        probe_main(spec, [folder, "--prompt-ids", ",".join(["1"] * 65)])
    with pytest.raises(ProbeError, match="no tokenizer.json.*--prompt-ids"):
        probe_main(registry.get("case_study"), [folder])


def test_report_on_a_model_folder(folders, tmp_path):
    """Every registered probe in one report; the ones a model cannot answer are skipped with
    their one-line reason (no routed experts, no tokenizer for Dyck prompts)."""
    from smelt_interp.report import main as report_main

    out = tmp_path / "report.json"
    html = tmp_path / "report.html"
    argv = [str(folders["hrm_text"]), "--prompt-ids", ROW, "--json", str(out), "--html", str(html)]
    assert report_main(argv) == 0 and html.stat().st_size > 0
    probes = json.loads(out.read_text())["probes"]
    assert set(probes) >= {"sink", "similarity", "residual", "lens", "dla"}
    skipped = {name: next(iter(p["skipped"].values()), "") for name, p in probes.items()}
    assert "dense MLP" in skipped["routing"] and "no tokenizer" in skipped["case_study"]
    assert not skipped["sink"] and probes["sink"]["tables"]["heads"]


def test_bad_folders_are_one_line_with_exit_2(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    for folder, words in ((empty, "config.json"), (foreign, "hrm_text")):
        done = subprocess.run(
            [sys.executable, "-m", "smelt_interp.probes.sink", str(folder), "--prompt-ids", "1,2"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and str(folder) in lines[0], done.stderr


def test_case_study_in_the_folders_own_tokens(tmp_path):
    folder = tiny_folder(tmp_path, "dory", "dory_bpe", tokenizer=True)
    out = tmp_path / "case.json"
    argv = [str(folder), "--demos", "0,1", "--n-seqs", "3", "--json", str(out)]
    assert probe_main(registry.get("case_study"), argv) == 0
    payload = json.loads(out.read_text())
    (described,) = payload["models"].values()
    visits = payload["tables"]["visits"]
    assert {(r["layer"], r["visit"]) for r in visits} >= {(1, 0), (1, 1), (1, 2)}
    assert all(0.0 <= r["bos_mass"] <= 1.0 for r in visits)
    # text is encoded with the folder's tokenizer: BOS first, as its post-processor adds it
    assert probe_main(registry.get("sink"), [str(folder), "--prompt", "( [ ] )"]) == 0
    from smelt_interp.loading import load_model, model_tokenizer

    model, info = load_model(folder)
    tokenizer = model_tokenizer(info)
    assert model.cfg.first_token_id == tokenizer.bos_id == 1
    assert tokenizer.encode("( )")[0] == 1 and tokenizer.token_labels([1]) == ["<s>"]
