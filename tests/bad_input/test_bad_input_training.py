"""Bad input on the training and checkpoint side: every bad value or file
gets one `error: ...` line and exit code 2, never a traceback; a NaN never reaches a checkpoint;
a torn metrics log resumes; a second trainer on one folder is refused; stale temp files go; and
every command that loads a checkpoint refuses a damaged one in one line before allocating what
its config asks for. Commands run in-process through `runpy`, exactly as `python -m` runs them.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import resource
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.bad_input import assert_one_line_error, digest, run_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smelt_interp.checkpoint import load_checkpoint
from smelt_interp.config import ModelConfig
from smelt_interp.errors import ConfigError
from smelt_interp.train.config import FLAT_PATHS, TrainConfig
from smelt_interp.train.presets import get_preset

PROBE_COMMANDS = [
    f"smelt_interp.probes.{name}"
    for name in ("sink", "routing", "similarity", "residual", "case_study", "lens", "dla")
]
# Every command that opens a checkpoint, with the arguments that come before the checkpoint.
LOADERS: list[tuple[str, list[str]]] = [
    *[(module, []) for module in PROBE_COMMANDS],
    ("smelt_interp.report", []),
    ("smelt_interp.train", ["eval"]),
    ("smelt_interp.analysis.downstream", []),
    ("smelt_interp.app", []),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def loader_argv(module: str, extra: list[str], ckpt: Path, other: Path) -> list[Any]:
    """Arguments that make `module` load `ckpt` first."""
    if module == "smelt_interp.analysis.downstream":
        return [ckpt, other]
    if module == "smelt_interp.app":
        return [ckpt, "--port", free_port()]
    return [*extra, ckpt]


@pytest.fixture
def no_dashboard(monkeypatch: pytest.MonkeyPatch) -> None:
    """The app must fail while loading; should it load, fail instead of serving forever."""
    import smelt_interp.app.server as server

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the app loaded a damaged checkpoint and was about to serve it")

    monkeypatch.setattr(server, "create_app", refuse)


# ----- training never saves a NaN, resumes from a torn log, refuses a busy folder -----------------


def train(out: Path, *sets: str, arch: str = "baseline", resume: bool = False) -> tuple[int, str]:
    """`python -m smelt_interp.train` on the tiny preset, one architecture: (exit code, stderr)."""
    args: list[Any] = ["--preset", "dyck-pair-tiny", "--arch", arch, "--out", out, "--quiet"]
    for item in ("threads=1", "eval_every=1000", "dyck_eval_n=4", *sets):
        args += ["--set", item]
    if resume:
        args.append("--resume")
    code, _, err = run_command("smelt_interp.train", *args)
    return code, err


def all_finite(tensors: dict[str, Any]) -> bool:
    return all(
        bool(torch.isfinite(t).all())
        for t in tensors.values()
        if torch.is_tensor(t) and t.is_floating_point()
    )


def test_divergence_never_saves_nan_weights(tmp_path: Path) -> None:
    # lr 30: at step 35 the loss is still finite but the gradient norm is NaN, and step 35 is a
    # checkpoint boundary: a trainer that saved it unchecked would write all-NaN weights.
    code, err = train(tmp_path, "lr=30", "warmup_steps=1", "ckpt_every=5", "steps=60")
    assert_one_line_error(code, err, "last good checkpoint")
    assert any(word in err.lower() for word in ("nan", "inf", "non-finite")), err
    run = tmp_path / "baseline"
    model, info = load_checkpoint(run / "ckpt.pt")  # refuses non-finite weights itself
    assert all_finite(model.state_dict()) and info.step is not None and info.step % 5 == 0
    state = torch.load(run / "state.pt", weights_only=True)
    assert state["step"] == info.step and all_finite(state["model"])
    assert all(all_finite(s) for s in state["optimizer"]["state"].values())


def test_resume_refuses_a_state_with_nan_weights_or_damage_in_one_line(tmp_path: Path) -> None:
    assert train(tmp_path, "steps=2", "ckpt_every=1", "warmup_steps=1")[0] == 0
    state_path = tmp_path / "baseline" / "state.pt"
    state = torch.load(state_path, weights_only=True)
    state["model"] = {k: v * math.nan for k, v in state["model"].items()}
    torch.save(state, state_path)  # as an unchecked save after a divergence would
    code, err = train(tmp_path, "steps=2", "ckpt_every=1", "warmup_steps=1", resume=True)
    assert_one_line_error(code, err, "state.pt", "non-finite")
    for damaged in ([1, 2], {"train_config": state["train_config"]}):
        torch.save(damaged, state_path)
        code, err = train(tmp_path, "steps=2", "ckpt_every=1", "warmup_steps=1", resume=True)
        assert_one_line_error(code, err, "state.pt", "cannot resume")


def test_resume_survives_a_torn_metrics_line_and_rewrites_by_rename(tmp_path: Path) -> None:
    assert train(tmp_path, "steps=6", "ckpt_every=3", "warmup_steps=1")[0] == 0
    metrics = tmp_path / "baseline" / "metrics.jsonl"
    whole = metrics.read_text()
    with metrics.open("a") as fh:
        fh.write('{"step": 7, "loss"')  # a kill mid-append
    old_inode = tmp_path / "old-inode"
    os.link(metrics, old_inode)
    code, err = train(tmp_path, "steps=6", "ckpt_every=3", "warmup_steps=1", resume=True)
    assert code == 0, err
    text = metrics.read_text()
    assert text.startswith(whole)  # every whole record kept, the torn one dropped
    rows = [json.loads(line) for line in text.splitlines()]
    assert [r["step"] for r in rows if r["event"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert old_inode.read_text().endswith('"loss"')  # replaced by a rename, not in place


def test_resume_refuses_a_damaged_metrics_line_and_keeps_it(tmp_path: Path) -> None:
    assert train(tmp_path, "steps=3", "ckpt_every=3", "warmup_steps=1")[0] == 0
    metrics = tmp_path / "baseline" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], "garbage", *lines[1:]]) + "\n")
    before = digest(metrics)
    code, err = train(tmp_path, "steps=3", "ckpt_every=3", "warmup_steps=1", resume=True)
    assert_one_line_error(code, err, "metrics.jsonl", "line 2")
    assert digest(metrics) == before


def test_second_trainer_on_one_folder_is_refused_and_a_killed_one_leaves_no_lock(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "baseline" / ".lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code, err = train(tmp_path, "steps=2")
        assert_one_line_error(code, err, "in use", str(tmp_path / "baseline"))
        assert not (tmp_path / "baseline" / "metrics.jsonl").exists()
    finally:
        holder.kill()
        holder.wait(timeout=30)
    code, err = train(tmp_path, "steps=2")  # the killed holder's lock went with it
    assert code == 0, err
    code, err = train(tmp_path, "steps=2")  # and a finished run released its own
    assert code == 0, err


def test_stale_temp_files_of_a_killed_save_are_removed(tmp_path: Path) -> None:
    run = tmp_path / "baseline"
    (run / "branch-1").mkdir(parents=True)
    stale = [
        run / ".ckpt.pt.k1ll3d.tmp",
        run / ".state.pt.x_9Ab.tmp",
        run / "branch-1" / ".ckpt.pt.abc123.tmp",
    ]
    for path in stale:
        path.write_bytes(b"half a checkpoint")
    foreign = run / ".notes.txt.abc.tmp"  # not the trainer's: left alone
    foreign.write_text("x")
    assert train(tmp_path, "steps=2")[0] == 0
    assert not any(path.exists() for path in stale)
    assert foreign.exists()


def test_ladder_writes_its_table_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from smelt_interp.train import ladder

    calls: list[Path] = []
    real = ladder.atomic_write_text
    monkeypatch.setattr(ladder, "Trainer", lambda *a, **k: type("T", (), {"run": lambda s: 0})())
    monkeypatch.setattr(ladder, "ladder_rows", lambda out, size, cfg: [{"arch": cfg.arch}])
    monkeypatch.setattr(
        ladder, "atomic_write_text", lambda path, text: calls.append(Path(path)) or real(path, text)
    )
    ladder.run_ladder(dict(ladder.CPU_LADDER), ladder.CPU_SIZES[:1], tmp_path, progress=False)
    assert calls == [tmp_path / ladder.RUNS_FILE] * 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [ladder.RUNS_FILE]


# ----- damaged checkpoints, one line from every loader --------------------------------------------


def mutated(src: Path, dst: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    payload = torch.load(src, weights_only=True)
    change(payload)
    torch.save(payload, dst)
    return dst


def _nan_first_tensor(payload: dict[str, Any]) -> None:
    name = next(iter(payload["state_dict"]))
    payload["state_dict"][name] = torch.full_like(payload["state_dict"][name], math.nan)


MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "string_for_a_number": lambda p: p["config"].__setitem__("rope_theta", "abc"),
    "meta_not_a_dict": lambda p: p.__setitem__("meta", [1, 2]),
    "huge_context": lambda p: p["config"].__setitem__("max_seq_len", 2e8),
    "huge_int_context": lambda p: p["config"].__setitem__("max_seq_len", 200_000_000),
    "rope_table_beyond_ram": lambda p: p["config"].update(max_seq_len=1 << 20, d_head=4096),
    "nan_weights": _nan_first_tensor,
    "config_not_a_dict": lambda p: p.__setitem__("config", "d_model=8"),
    "state_dict_not_a_dict": lambda p: p.__setitem__("state_dict", [1]),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@pytest.mark.parametrize(
    "module,extra", LOADERS, ids=[m.rsplit(".", 1)[-1] + "-".join(["", *e]) for m, e in LOADERS]
)
def test_every_loader_gives_one_line_for_a_damaged_checkpoint(
    tiny_pair: dict[str, Path],
    tmp_path: Path,
    no_dashboard: None,
    module: str,
    extra: list[str],
    mutation: str,
) -> None:
    bad = mutated(tiny_pair["smelt"], tmp_path / f"{mutation}.pt", MUTATIONS[mutation])
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, _, err = run_command(module, *loader_argv(module, extra, bad, tiny_pair["baseline"]))
    assert_one_line_error(code, err, bad.name)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mib < 500, f"{mutation}: peak memory grew {grown_mib:.0f} MiB before failing"


def test_a_legacy_pickle_is_named_as_such_without_torch_warnings(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(pickle.dumps({"config": {}, "state_dict": {}}))
    code, _, err = run_command("smelt_interp.probes.sink", legacy)
    assert_one_line_error(code, err, "legacy", "will not be loaded")
    assert "corrupt" not in err and "warning" not in err.lower()


def test_report_on_nan_weights_names_how_many_tensors(
    tiny_pair: dict[str, Path], tmp_path: Path
) -> None:
    def poison(payload: dict[str, Any]) -> None:
        for name in list(payload["state_dict"])[:3]:
            payload["state_dict"][name] = payload["state_dict"][name] * math.inf

    bad = mutated(tiny_pair["smelt"], tmp_path / "diverged.pt", poison)
    out = [tmp_path / "r.json", tmp_path / "r.html"]
    code, _, err = run_command("smelt_interp.report", bad, "--json", out[0], "--html", out[1])
    assert_one_line_error(code, err, "diverged.pt", "3 of", "nan or infinite")
    assert not any(path.exists() for path in out)


def test_model_config_bounds_are_checked_before_allocating(make_cfg) -> None:
    with pytest.raises(ConfigError, match="max_seq_len"):
        make_cfg(max_seq_len=200_000_000)
    with pytest.raises(ConfigError, match="d_model"):
        make_cfg(d_model=10**9)
    with pytest.raises(ConfigError, match="rope_theta"):
        make_cfg(rope_theta="abc")
    with pytest.raises(ConfigError, match="norm_eps"):
        make_cfg(norm_eps=math.nan)
    cfg = make_cfg(max_seq_len=1 << 20, d_head=4096, n_heads=4, n_kv_heads=2)
    with pytest.raises(ConfigError, match=r"needs about 128\.\d GiB"):
        cfg.check_memory(limit=64 << 30)


def test_model_config_counts_every_parameter(make_cfg, make_model) -> None:
    for looped in (False, True):
        cfg = make_cfg(looped=looped)
        model = make_model(cfg)
        assert cfg.n_params == sum(p.numel() for p in model.parameters())


# ----- an output folder that cannot be one --------------------------------------------------------


def test_train_and_ladder_outputs_under_a_file_give_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "plain-file"
    blocker.write_text("x")
    for out in (blocker, blocker / "sub"):
        code, err = train(out, "steps=1")
        assert_one_line_error(code, err, "plain-file", "not a folder")
        code, _, err = run_command("smelt_interp.train", "ladder", "--sizes", "1", "--out", out)
        assert_one_line_error(code, err, "plain-file", "not a folder")
    code, _, err = run_command(
        "smelt_interp.train", "--preset", "dyck-pair-tiny", "--out", blocker, "--quiet"
    )  # the pair: refused before the Baseline trains, not after
    assert_one_line_error(code, err, "plain-file")
    assert blocker.read_text() == "x"


# ----- configuration values, one line each --------------------------------------------------------

BAD_SETS = [
    "threads=-1",
    "device=foo",
    "device=cuda:x",
    "device=cuda:99",
    "device=meta",
    "device=mps",
    "beta1=2",
    "arch_lr=[1]",
    'data={"dyck":"x"}',
    'dyck={"bogus":1}',
    'dyck={"max_len":"x"}',
    'seed="abc"',
    "batch_size=1e8",
    "batch_size=100000000",
    "model.max_seq_len=1e8",
    "model.max_seq_len=100000000",
    "grad_clip=-1",
    "grad_clip=0",
    "grad_clip=nan",
    "weight_decay=-1",
    "lr=Infinity",
    "lr=-1",
    "warmup_steps=-3",
    "decay_shape=zigzag",
    'data={"dyck":-1}',
    'data={"dyck":0}',
    "beta2=nan",
    "branches=[0]",
    "branches=7",
    "steps=1e20",
    "steps=true",
    "compile=1",
    "data_paths=7",
    "model.hidden_key_ids=[257]",
    "model.hidden_key_ids=[999]",
    "model.hidden_key_ids=[-1]",
    'model.hidden_key_ids="16"',
    "model.hidden_key_ids=[16,16]",
    "model.hide_keys_from=-1",
    "matcher.width_step=0",
    "matcher.expert_step=-64",
]


@pytest.mark.parametrize("item", BAD_SETS)
def test_train_set_rejects_meaningless_values_in_one_line(tmp_path: Path, item: str) -> None:
    code, err = train(tmp_path, "steps=2", item)
    assert_one_line_error(code, err, item.split("=")[0].split(".")[-1])
    assert not (tmp_path / "baseline").exists()


def test_a_batch_beyond_memory_is_refused_up_front_with_its_size(tmp_path: Path) -> None:
    code, err = train(tmp_path, "steps=2", "batch_size=1048576")
    assert_one_line_error(code, err, "batch_size", "GiB")
    assert not (tmp_path / "baseline").exists()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--d-model", "1e9"], "--d-model"),
        (["--d-model", "1000000000"], "d_model"),
        # within every bound, but a search of 4e8 head layouts (minutes): refused up front
        (
            ["--d-model", "65536", "--n-heads", "512", "--n-kv-heads", "512", "--d-head", "128"],
            "head layouts",
        ),
    ],
)
def test_budget_refuses_work_it_cannot_finish(args: list[str], needle: str) -> None:
    code, _, err = run_command("smelt_interp.budget", *args)
    assert_one_line_error(code, err, needle)


JSON_LIKE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
NEAR_VALID = st.sampled_from([0, 1, 2, 3, -1, 0.5, 1e-3, 2**31, "cosine", "cpu", "cuda:0"])


def _usable_train_config(cfg: TrainConfig) -> None:
    """What the trainer relies on, checked for a config that validation accepted."""
    for name in ("lr", "weight_decay", "grad_clip", "beta1", "beta2", "min_lr_ratio"):
        section, field = FLAT_PATHS[name]
        value = getattr(getattr(cfg, section), field)
        assert isinstance(value, (int, float)) and math.isfinite(value) and value >= 0, name
    assert (
        0 <= cfg.optim.beta1 < 1
        and 0 <= cfg.optim.beta2 < 1
        and cfg.optim.grad_clip > 0
        and cfg.optim.lr > 0
    )
    for horizon in cfg.schedule.horizons:
        assert all(math.isfinite(cfg.lr_schedule(horizon)(s)) for s in (0, horizon - 1))
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.activation_bytes() > 0 and sum(cfg.corpus.weights.values()) > 0


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(sorted(TrainConfig.__dataclass_fields__)),
    value=JSON_LIKE | NEAR_VALID,
)
def test_any_train_config_value_is_accepted_usable_or_a_config_error(field: str, value: Any):
    raw = {**get_preset("dyck-pair-tiny"), field: value}
    try:
        cfg = TrainConfig.from_dict(raw)
    except ConfigError:
        return
    _usable_train_config(cfg)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(sorted(ModelConfig.__dataclass_fields__)),
    value=JSON_LIKE | NEAR_VALID,
    nested=st.booleans(),
)
def test_any_model_config_value_is_accepted_usable_or_a_config_error(
    field: str, value: Any, nested: bool
) -> None:
    base = get_preset("dyck-pair-tiny")
    try:
        if nested:  # through the training config, as `--set model.FIELD=VALUE` gives it
            cfg = TrainConfig.from_dict({**base, "model": {**base["model"], field: value}}).model
        else:
            cfg = ModelConfig.from_dict({**ModelConfig().to_dict(), field: value})
    except ConfigError:
        return
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.effective_depth == len(cfg.schedule) >= 1
    assert cfg.n_params > 0 and cfg.build_bytes > 0


@settings(max_examples=200, deadline=None)
@given(data=JSON_LIKE)
def test_any_whole_config_is_a_config_or_a_config_error(data: Any) -> None:
    for build in (TrainConfig.from_dict, ModelConfig.from_dict):
        try:
            build(data)
        except ConfigError:
            pass
