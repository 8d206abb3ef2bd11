"""Bad input, round five, on the model side: transformers model folders that ask for remote code
in any JSON file (refused before transformers is asked, so it never prompts on standard input),
loop counts past the adapter's caps, JSON in a folder the parser cannot hold, `--prompt-ids`
and the dashboard's `ids:` prompt with numbers too long to be ids, `budget --kernel-friendly`
on extreme shapes (its whole search within one work budget), and the over-training figure built
once per change of the runs' logs."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers.bad_input import assert_one_line_error, run_command

pytest.importorskip("transformers")

from helpers.bpe_models import tiny_checkpoint  # noqa: E402
from helpers.tiny_looped import tiny_folder, tiny_model  # noqa: E402

import smelt_interp.budget.matcher as matcher  # noqa: E402
from smelt_interp.adapters import adapt  # noqa: E402
from smelt_interp.app.prompt_run import encode_prompt  # noqa: E402
from smelt_interp.budget.kernel import match_kernel_friendly  # noqa: E402
from smelt_interp.config import ModelConfig  # noqa: E402
from smelt_interp.data.tokenizer import ByteTokenizer  # noqa: E402
from smelt_interp.errors import CheckpointError, MatchError, PromptError  # noqa: E402
from smelt_interp.loading import load_model  # noqa: E402

DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "9" * 5_000
AUTO_MAP = {"AutoTokenizer": ["tokenization_mine.MyTokenizer", None]}


@pytest.fixture(scope="module")
def folder_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An hrm_text folder with a tokenizer (tokenizer.json) and a dory one without."""
    root = tmp_path_factory.mktemp("round5_folders")
    tiny_folder(root, "hrm_text", tokenizer=True)
    tiny_folder(root, "dory")
    return root


def copy_folder(root: Path, arch: str, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(root / arch, tmp_path / arch))


@pytest.fixture
def transformers_never_asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every transformers loader replaced by one that records it was called: a folder refused
    for remote code must be refused before any of them runs."""
    import transformers

    called: list[str] = []
    for name in ("AutoTokenizer", "AutoConfig", "AutoModelForCausalLM"):

        def record(*args: Any, _name: str = name, **kwargs: Any) -> Any:
            called.append(_name)
            raise AssertionError(f"transformers.{_name} was asked to load the folder")

        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", record)
    return called


# ----- remote code in any JSON file of a folder ------------------------------------------------
def with_remote_code(folder: Path, where: str) -> Path:
    """`folder` with an auto_map in `where`: the tokenizer's config, a processor's config, or
    a sub-config of config.json."""
    if where == "config.json text_config":
        config = json.loads((folder / "config.json").read_text())
        config["text_config"] = {"auto_map": {"AutoConfig": "configuration_mine.MyConfig"}}
        (folder / "config.json").write_text(json.dumps(config))
    else:
        record = {"tokenizer_class": "MyTokenizer", "auto_map": AUTO_MAP}
        (folder / where).write_text(json.dumps(record))
    (folder / "tokenization_mine.py").write_text("raise SystemExit('the folder ran its code')\n")
    return folder


SPOTS = ["tokenizer_config.json", "processor_config.json", "config.json text_config"]


@pytest.mark.parametrize("where", SPOTS)
def test_a_folder_asking_for_remote_code_anywhere_is_refused_before_transformers(
    folder_root: Path, tmp_path: Path, transformers_never_asked: list[str], where: str
) -> None:
    folder = with_remote_code(copy_folder(folder_root, "hrm_text", tmp_path), where)
    with pytest.raises(CheckpointError, match=r"trust_remote_code.*--trust-remote-code") as info:
        load_model(folder)
    assert where.split()[0] in str(info.value) and "\n" not in str(info.value)
    assert transformers_never_asked == []


@pytest.mark.parametrize(
    ("module", "extra"),
    [("smelt_interp.probes.sink", ["--prompt-ids", "1,2,3"]),
     ("smelt_interp.report", ["--prompt-ids", "1,2,3"])],
)  # fmt: skip
@pytest.mark.parametrize("where", SPOTS[:2])
def test_the_probes_and_the_report_refuse_remote_code_in_one_line(
    folder_root: Path, tmp_path: Path, module: str, extra: list[str], where: str
) -> None:
    folder = with_remote_code(copy_folder(folder_root, "hrm_text", tmp_path), where)
    code, _, err = run_command(module, folder, *extra)
    assert_one_line_error(code, err, where, "--trust-remote-code")


def test_the_app_start_up_refuses_remote_code_in_one_line(
    folder_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import smelt_interp.app.server as server

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the app loaded the folder and was about to serve it")

    monkeypatch.setattr(server, "create_app", refuse)
    folder = with_remote_code(copy_folder(folder_root, "hrm_text", tmp_path), SPOTS[0])
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, _, err = run_command("smelt_interp.app", folder, "--port", port)
    assert_one_line_error(code, err, "tokenizer_config.json", "--trust-remote-code")


def test_transformers_is_always_told_whether_remote_code_may_run(
    folder_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never None (transformers' cue to ask on standard input): False without the flag."""
    import transformers

    seen: list[Any] = []
    for cls in (transformers.AutoTokenizer, transformers.AutoConfig):
        original = cls.from_pretrained

        def spy(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            seen.append(kwargs.get("trust_remote_code", "missing"))
            return _original(*args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    load_model(folder_root / "hrm_text")
    assert len(seen) >= 2 and all(value is False for value in seen), seen


# ----- loop counts past the caps --------------------------------------------------------------
@pytest.mark.parametrize(
    ("arch", "counts", "needle"),
    [
        ("hrm_text", {"H_cycles": 100_000}, "H_cycles is 100000"),
        ("hrm_text", {"L_cycles": 100_000}, "L_cycles is 100000"),
        ("hrm_text", {"H_cycles": 0}, "H_cycles is 0"),
        ("hrm_text", {"L_cycles": -1}, "L_cycles is -1"),
        ("hrm_text", {"H_cycles": 100, "L_cycles": 100}, "layer visits"),
        ("dory", {"n_recurrent_loops": 5_000}, "n_recurrent_loops is 5000"),
        ("dory", {"n_recurrent_loops": 0}, r"n_recurrent_loops (is|must be at least 1, got) 0"),
    ],
)
def test_loop_counts_past_the_caps_are_refused_before_the_model_is_built(
    folder_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    arch: str,
    counts: dict,
    needle: str,
) -> None:
    import transformers

    folder = copy_folder(folder_root, arch, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **counts}))

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was built")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    with pytest.raises(CheckpointError, match=needle):
        load_model(folder)


@pytest.mark.parametrize(("count", "needle"), [(2_000, "2000"), (0, "is 0")])
def test_adapting_an_in_memory_model_checks_its_loop_counts_first(count: int, needle: str):
    hf = tiny_model("dory")
    hf.config.n_recurrent_loops = count
    with pytest.raises(CheckpointError, match=needle):
        adapt(hf)


@pytest.mark.parametrize("value", [DEEP, f'{{"model_type": "hrm_text", "n": {HUGE}}}'])
@pytest.mark.parametrize("module", ["smelt_interp.probes.sink", "smelt_interp.report"])
def test_a_folder_config_the_parser_cannot_hold_is_one_line(
    folder_root: Path, tmp_path: Path, value: str, module: str
) -> None:
    folder = copy_folder(folder_root, "dory", tmp_path)
    (folder / "config.json").write_text(value)
    code, _, err = run_command(module, folder, "--prompt-ids", "1,2,3")
    assert_one_line_error(code, err, "config.json")


# ----- --prompt-ids and the dashboard's ids: prompt ---------------------------------------------
@pytest.fixture(scope="module")
def byte_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("round5_ckpt") / "ckpt.pt", ByteTokenizer())


@pytest.mark.parametrize(
    "ids",
    ["1,99999999999999999999999", f"1,{2**63}", f"1,{2**64 + 5}", f"2,{HUGE}", "3,-9" + "9" * 30],
)
@pytest.mark.parametrize("module", ["smelt_interp.probes.sink", "smelt_interp.report"])
def test_prompt_ids_too_large_for_any_vocabulary_are_one_line(
    byte_ckpt: Path, module: str, ids: str
) -> None:
    code, _, err = run_command(module, byte_ckpt, "--prompt-ids", ids)
    assert_one_line_error(code, err, "--prompt-ids")


@pytest.mark.parametrize(
    "text",
    [f"ids: {HUGE}", f"ids: 1, 2, {'8' * 4_301}", f"ids: 1 {'1' * 100_000}", f"IDS:{HUGE},3"],
)
def test_a_dashboard_ids_prompt_with_a_huge_number_says_what_is_wrong(text: str) -> None:
    with pytest.raises(PromptError, match=r"digits\) is larger than any vocabulary"):
        encode_prompt(text, 64, ByteTokenizer(), vocab_size=259)


def test_a_dashboard_ids_prompt_within_bounds_still_reads() -> None:
    assert encode_prompt("ids: 1, 17,42", 64, ByteTokenizer(), vocab_size=259) == [1, 17, 42]
    with pytest.raises(PromptError, match="outside the model's vocabulary"):
        encode_prompt("ids: 1, 999999999999", 64, ByteTokenizer(), vocab_size=259)


# ----- budget --kernel-friendly on extreme shapes -----------------------------------------------
EXTREME = [
    dict(d_model=65536, n_heads=720, n_kv_heads=1, d_head=64, n_layers=2),
    dict(d_model=65536, n_heads=1008, n_kv_heads=1, d_head=64, n_layers=2),
    dict(d_model=32768, n_heads=840, n_kv_heads=1, d_head=64, n_layers=2),
]


@pytest.mark.parametrize("shape", EXTREME)
def test_the_kernel_friendly_search_stays_within_one_work_budget(
    monkeypatch: pytest.MonkeyPatch, shape: dict
) -> None:
    """Each SMELT shape the search scores costs SHAPE_COST units of MAX_SEARCH (lowered here,
    so the test is quick): the whole search, over every Baseline variant and step, scores at
    most MAX_SEARCH / SHAPE_COST of them, then stops with one line; without a shared budget
    each variant's search passed its own cap and the whole ran for minutes."""
    limit = 1_000_000
    monkeypatch.setattr(matcher, "MAX_SEARCH", limit)
    scored = [0]
    original = matcher._expert_options

    def counted(*args: Any, **kwargs: Any) -> Any:
        scored[0] += 1
        if scored[0] > 1.2 * limit / matcher.SHAPE_COST:
            raise RuntimeError(f"the search scored {scored[0]:,} shapes: unbounded")
        return original(*args, **kwargs)

    monkeypatch.setattr(matcher, "_expert_options", counted)
    base = ModelConfig.baseline(
        **{"n_experts": 32, "top_k": 8, "d_expert": 256, "max_seq_len": 2048, **shape}
    )
    with pytest.raises(MatchError, match=f"passed {limit:,} layouts tried"):
        match_kernel_friendly(base, seq_len=2048)
    assert scored[0] <= limit / matcher.SHAPE_COST


def test_the_budget_command_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matcher, "MAX_SEARCH", 1_000_000)
    args = ["--d-model", "65536", "--n-heads", "720", "--n-kv-heads", "1", "--d-head", "64"]
    args += ["--n-layers", "2", "--d-expert", "256", "--kernel-friendly"]
    code, _, err = run_command("smelt_interp.budget", *args)
    assert_one_line_error(code, err, "layouts tried")


def test_a_kernel_friendly_pair_within_the_budget_is_still_found() -> None:
    base = ModelConfig.baseline(
        d_model=768, n_layers=12, n_heads=12, n_kv_heads=4, d_head=64, n_experts=16, top_k=4,
        d_expert=384, max_seq_len=2048,
    )  # fmt: skip
    match = match_kernel_friendly(base, seq_len=2048)
    assert match.smelt.d_head % 64 == 0 and match.table["within"].all()


# ----- the over-training figure, once per change of the logs ----------------------------------
def eval_line(step: int, value: float) -> str:
    record = {"event": "eval", "step": step, "tokens": 64 * step}
    for layer, visit, head in [(0, 0, 0), (1, 0, 0), (1, 1, 0)]:
        for stat in ("bos_non_answer", "demo_answer", "bos_answer"):
            record[f"case/{stat}/{layer}.{visit}.{head}"] = value
    return json.dumps({**record, "case/answer_acc": value}) + "\n"


def test_the_over_training_figure_is_built_once_per_change_of_the_logs(tmp_path: Path) -> None:
    import os

    import smelt_interp.figures.case_training as kept
    from smelt_interp.figures.case_study import over_training
    from smelt_interp.train.case_eval import case_history

    logs = {name: tmp_path / name / "metrics.jsonl" for name in ("baseline", "smelt")}
    for i, path in enumerate(logs.values()):
        path.parent.mkdir()
        path.write_text(eval_line(10, 0.1 + i) + eval_line(20, 0.2 + i))
    before = kept.builds
    first = kept.over_training_of_logs(logs, {"smelt": 0.05})
    want = over_training({n: case_history(p) for n, p in logs.items()}, uniform={"smelt": 0.05})
    assert first == want.to_plotly_json()  # the same figure as drawn afresh
    threads = [
        threading.Thread(target=kept.over_training_of_logs, args=(logs, {"smelt": 0.05}))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert kept.builds == before + 1  # nine requests, one build
    with open(logs["smelt"], "a") as fh:  # a run writes a new evaluation
        fh.write(eval_line(30, 0.3))
    second = kept.over_training_of_logs(logs, {"smelt": 0.05})
    assert kept.builds == before + 2 and second != first
    stat = logs["baseline"].stat()  # the same size, rewritten: its time tells
    os.utime(logs["baseline"], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    kept.over_training_of_logs(logs, {"smelt": 0.05})
    kept.over_training_of_logs(logs, {"smelt": 0.05, "baseline": 0.1})  # other levels
    assert kept.builds == before + 4
    kept.over_training_of_logs(logs, {"smelt": 0.05, "baseline": 0.1})
    assert kept.builds == before + 4


def test_the_load_benchmark_serves_runs_with_their_logs(tmp_path: Path) -> None:
    """Its default pair carries the metrics.jsonl a run of the preset writes, which the
    Case study's and the Overview's figures read, and the SMELT run is SMELT-shaped."""
    from benchmarks.load_bench import write_pair
    from smelt_interp.checkpoint import load_checkpoint
    from smelt_interp.train.case_eval import case_history
    from smelt_interp.train.sink_eval import sink_history

    folder = write_pair(tmp_path)
    for arch in ("baseline", "smelt"):
        log = folder / arch / "metrics.jsonl"
        cases, sinks = case_history(log), sink_history(log)
        assert cases["step"].nunique() == 24 and sinks["step"].nunique() == 24
        model, _ = load_checkpoint(folder / arch / "ckpt.pt")
        visits = {(int(r.layer), int(r.visit)) for r in cases.dropna(subset=["layer"]).itertuples()}
        assert visits == set(model.schedule)
    smelt, _ = load_checkpoint(folder / "smelt" / "ckpt.pt")
    assert smelt.cfg.is_looped
