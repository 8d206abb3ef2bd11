"""Bad input, round five, on the data path: `data prepare` and its folders (FIFOs, devices,
a line without end, ids past the shard's dtype, another tokenizer, changed sources, a domain
named like a generated task, damaged Parquet, JSON the parser cannot hold), `train --shards`
and its resume, `gather`'s record, and the curves' run names. Every refusal is one `error:`
line with exit code 2 (or the one-line error the command prints); what could hang runs in a
child process with a timeout."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.bad_input import assert_one_line_error, digest, run_bounded, run_command
from helpers.bpe_models import BPE_VOCAB, prepared_bpe_shards, sample_texts, trained_on_shards

import smelt_interp.data.prepare as prepare_module
from smelt_interp.data.bpe import BpeTokenizer, train_bpe
from smelt_interp.data.local_text import GATHER_FILE
from smelt_interp.data.prepare import prepare
from smelt_interp.data.shards import MANIFEST, TOKENIZER_FILE, Shard, ShardSet
from smelt_interp.errors import CheckpointError, DataError, TokenizerError
from smelt_interp.train.curve_sinks import run_name

DATA = "smelt_interp.data"
DEEP = "[" * 100_000 + "]" * 100_000  # nested past any recursion limit
HUGE = "9" * 5_000  # past Python's 4,300-digit int limit


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def jsonl(path: Path, texts: list[str], **fields: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t, **fields}) + "\n" for t in texts))
    return path


# ----- prepare: inputs that would block or never end ------------------------------------------
def blocking_source(tmp_path: Path, case: str) -> Path:
    """The source of `case`: a FIFO named, or inside a folder under a source's suffix, or a
    device that never ends."""
    folder = tmp_path / "src"
    jsonl(folder / "a.jsonl", ["some text"])
    if case == "named FIFO":
        return fifo(tmp_path / "pipe.jsonl")
    if case == "/dev/zero":
        return Path("/dev/zero")
    fifo(folder / f"pipe{case.split()[-1]}")  # "FIFO in folder .txt" and so on
    return folder


@pytest.mark.parametrize(
    "case",
    [
        "named FIFO",
        "/dev/zero",
        "FIFO in folder .txt",
        "FIFO in folder .jsonl",
        "FIFO in folder .parquet",
    ],
)
def test_prepare_refuses_a_fifo_or_device_without_blocking(tmp_path: Path, case: str) -> None:
    source = blocking_source(tmp_path, case)
    out = tmp_path / "out"
    code, _, err = run_bounded(DATA, "prepare", source, "--out", out, "--quiet", timeout=60)
    assert_one_line_error(code, err, "not a regular file")
    assert not out.exists() or not any(out.glob("*.tok"))


@pytest.mark.parametrize("newline", ["\n", ""])
@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_jsonl_line_past_the_cap_is_refused_before_it_is_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, newline: str, where: str
) -> None:
    """One line longer than MAX_LINE_BYTES (here lowered to 1 MiB, so the test writes little)
    is refused naming the file and line, whether or not it ends with a newline."""
    import smelt_interp.data.prepare_sources as sources

    monkeypatch.setattr(sources, "MAX_LINE_BYTES", 1 << 20)
    path = tmp_path / "src" / "long.jsonl"
    path.parent.mkdir()
    line = json.dumps({"text": "x" * ((1 << 20) + 10)})
    path.write_text(json.dumps({"text": "short"}) + "\n" + line + newline)
    with pytest.raises(DataError, match=r"long\.jsonl:2: a line longer than 1 MiB"):
        prepare([str(path if where == "file" else path.parent)], tmp_path / "out")


def test_a_parquet_row_past_the_cap_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import smelt_interp.data.prepare_sources as sources

    monkeypatch.setattr(sources, "MAX_LINE_BYTES", 1 << 20)
    path = tmp_path / "long.parquet"
    pq.write_table(pa.table({"text": ["short", "y" * ((1 << 20) + 1)]}), path)
    with pytest.raises(DataError, match=r"long\.parquet: row 1 holds a document longer than"):
        prepare([str(path)], tmp_path / "out")


# ----- prepare: silent wrong data -------------------------------------------------------------
def gapped_tokenizer(tmp_path: Path, top: int) -> Path:
    """A smelt BPE tokenizer.json with one more token, at id `top` (past its count)."""
    data = json.loads(train_bpe(iter(sample_texts()), BPE_VOCAB).json)
    data["added_tokens"].append(
        {"id": top, "content": "<far>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": False}
    )  # fmt: skip
    data["model"]["vocab"]["<far>"] = top
    path = tmp_path / f"gapped-{top}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("top", [65_636, 65_536, 70_000, BPE_VOCAB + 5])
def test_a_tokenizer_whose_ids_pass_its_count_is_refused_before_any_shard(
    tmp_path: Path, top: int
) -> None:
    """An id past the tokenizer's count would be cast into the uint16 the folder is written
    in (65,636 stored as 100) or past the model's embedding: refused up front."""
    tok = gapped_tokenizer(tmp_path, top)
    src = jsonl(tmp_path / "a.jsonl", ["text <far> more text"] * 3)
    out = tmp_path / "out"
    code, _, err = run_command(DATA, "prepare", src, "--out", out, "--tokenizer", tok, "--quiet")
    assert_one_line_error(code, err, str(top))
    assert not list(out.glob("*.tok")) if out.exists() else True


@pytest.mark.parametrize("bad", [65_636, 70_000, -1])
def test_a_shard_writer_never_casts_an_id_into_another(tmp_path: Path, bad: int) -> None:
    from smelt_interp.data.shards import ShardWriter

    writer = ShardWriter(
        tmp_path / "d-train-00000.tok", vocab_size=65_536, bos_id=257,
        tokenizer_hash="0" * 32, domain="d", split="train",
    )  # fmt: skip
    with pytest.raises(DataError, match=str(bad)):
        writer.add(np.array([257, 5, bad], dtype=np.int64))
    writer.abort()


@pytest.mark.parametrize(
    ("first", "second"),
    [("bytes", "bpe:300"), ("bpe:300", "bytes"), ("bpe:300", "bpe:400"), ("bytes", "FILE")],
)
def test_prepare_again_with_another_tokenizer_is_refused(
    tmp_path: Path, first: str, second: str
) -> None:
    src = jsonl(tmp_path / "a.jsonl", sample_texts())
    out = tmp_path / "out"
    assert run_command(DATA, "prepare", src, "--out", out, "--tokenizer", first, "--quiet")[0] == 0
    if second == "FILE":
        second = str(tmp_path / "bpe.json")
        Path(second).write_text(train_bpe(iter(sample_texts()), BPE_VOCAB).json)
    before = {p.name: digest(p) for p in out.iterdir()}
    code, _, err = run_command(DATA, "prepare", src, "--out", out, "--tokenizer", second, "--quiet")
    assert_one_line_error(code, err, "another tokenizer")
    assert {p.name: digest(p) for p in out.iterdir()} == before


def test_prepare_again_with_the_same_tokenizer_is_still_done(tmp_path: Path) -> None:
    src = jsonl(tmp_path / "a.jsonl", sample_texts())
    out = tmp_path / "out"
    for _ in range(2):
        code, stdout, err = run_command(
            DATA, "prepare", src, "--out", out, "--tokenizer", "bpe:300", "--quiet"
        )
        assert code == 0, err


@pytest.mark.parametrize(
    "spec", ["dyck=SRC", "trigger=SRC", "assoc_recall=SRC", "LINE:dyck", "LINE:assoc_recall"]
)
def test_a_domain_named_like_a_generated_task_is_refused(tmp_path: Path, spec: str) -> None:
    """The trainer would draw its generated rows in that domain's place: none of its tokens
    would be trained on."""
    domain, _, rest = spec.partition("=")
    if spec.startswith("LINE:"):
        source = str(jsonl(tmp_path / "a.jsonl", ["words"], domain=spec[5:]))
    else:
        source = f"{domain}={jsonl(tmp_path / 'a.jsonl', ['words'])}"
    code, _, err = run_command(DATA, "prepare", source, "--out", tmp_path / "out", "--quiet")
    assert_one_line_error(code, err, "generates")


def test_shards_of_an_old_folder_with_a_generated_domain_are_not_trained_in_its_place(
    tmp_path: Path,
) -> None:
    from smelt_interp.train.data import TrainingData

    src = jsonl(tmp_path / "a.jsonl", sample_texts())
    out = tmp_path / "shards"
    prepare([f"prose={src}"], out, shard_tokens=2000)
    for path in out.glob("prose-*.tok"):  # a folder prepared before the name was refused
        raw = bytearray(path.read_bytes())
        raw[88 : 88 + 64] = b"dyck".ljust(64, b"\0")  # the header's domain field
        path.with_name(path.name.replace("prose", "dyck")).write_bytes(bytes(raw))
        path.unlink()
    manifest = json.loads((out / MANIFEST).read_text())
    for entry in manifest["shards"]:
        entry["file"], entry["domain"] = entry["file"].replace("prose", "dyck"), "dyck"
    (out / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="generated task"):
        TrainingData(_tiny_train_config(out, {"dyck": 1.0}, vocab=259))


def _tiny_train_config(folder: Path, data: dict[str, float], vocab: int):
    from smelt_interp.train.config import TrainConfig

    model = {"d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "d_head": 16,
             "n_experts": 2, "top_k": 1, "d_expert": 32, "vocab_size": vocab}  # fmt: skip
    return TrainConfig.from_dict(
        {"model": model, "arch": "baseline", "shards": str(folder), "data": data, "seq_len": 32,
         "batch_size": 4, "steps": 2, "warmup_steps": 1, "eval_every": 1000, "eval_rows": 2,
         "dyck_eval_n": 0}
    )  # fmt: skip


# ----- prepare: a resume over changed sources --------------------------------------------------
def interrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A folder of several source files and a preparation of it killed after its first
    finished shard (small batches and shards, so one finishes early)."""
    folder = tmp_path / "src"
    for i in range(6):
        jsonl(folder / f"part-{i}.jsonl", [f"{i}: {t}" for t in sample_texts()])
    out = tmp_path / "out"
    monkeypatch.setattr(prepare_module, "BATCH_BYTES", 2000)

    def killed(*_: int) -> None:
        if (out / MANIFEST).exists() and json.loads((out / MANIFEST).read_text())["shards"]:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare([str(folder)], out, shard_tokens=3000, progress=killed)
    assert not json.loads((out / MANIFEST).read_text())["complete"]
    return folder, out


@pytest.mark.parametrize("change", ["add a file", "remove a file", "append to a file", "none"])
def test_a_resumed_prepare_refuses_sources_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    folder, out = interrupted(tmp_path, monkeypatch)
    if change == "add a file":
        jsonl(folder / "part-0a.jsonl", ["a new document"] * 40)
    elif change == "remove a file":
        (folder / "part-5.jsonl").unlink()
    elif change == "append to a file":
        with open(folder / "part-1.jsonl", "a") as fh:
            fh.write(json.dumps({"text": "one more"}) + "\n")
    if change == "none":  # the same sources resume, and hold each document once
        prepare([str(folder)], out, shard_tokens=3000)
        docs = sum(len(Shard(p)) for p in out.glob("*.tok"))
        assert docs == 6 * len(sample_texts())
        return
    with pytest.raises(DataError, match="sources changed since this preparation began"):
        prepare([str(folder)], out, shard_tokens=3000)


# ----- prepare: damaged Parquet, JSON the parser cannot hold ----------------------------------
def damaged_parquet(tmp_path: Path, where: str) -> Path:
    table = pa.table({"text": [f"document {i} " * 20 for i in range(2000)]})
    path = tmp_path / f"{where}.parquet"
    pq.write_table(table, path, row_group_size=500, compression="none")
    raw = bytearray(path.read_bytes())
    if where == "page header":
        raw[4:40] = b"\xff" * 36
    elif where == "footer":
        start = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")
        raw[start : start + 40] = b"\x07" * 40
    else:  # a page's bytes
        raw[len(raw) // 2 : len(raw) // 2 + 64] = b"\xff" * 64
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("where", ["page header", "footer", "page body"])
def test_a_damaged_parquet_file_is_one_line(tmp_path: Path, where: str) -> None:
    path = damaged_parquet(tmp_path, where)
    code, _, err = run_command(DATA, "prepare", path, "--out", tmp_path / "out", "--quiet")
    assert_one_line_error(code, err, path.name, "parquet")


@pytest.mark.parametrize("value", [DEEP, f'{{"text": "a", "n": {HUGE}}}'])
def test_a_prepare_line_the_parser_cannot_hold_is_one_line(tmp_path: Path, value: str) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"text": "fine"}) + "\n" + value + "\n")
    code, _, err = run_command(DATA, "prepare", path, "--out", tmp_path / "out", "--quiet")
    assert_one_line_error(code, err, "a.jsonl:2")


@pytest.mark.parametrize("value", [DEEP, f'{{"model": {HUGE}}}', "[" * 2000 + "]" * 2000])
def test_a_tokenizer_file_the_parser_cannot_hold_is_one_line(tmp_path: Path, value: str) -> None:
    tok = tmp_path / "tok.json"
    tok.write_text(value)
    src = jsonl(tmp_path / "a.jsonl", ["words"])
    code, _, err = run_command(
        DATA, "prepare", src, "--out", tmp_path / "out", "--tokenizer", tok, "--quiet"
    )
    assert_one_line_error(code, err, "tok")


@pytest.mark.parametrize("value", [DEEP, HUGE, '{"json": ' + DEEP + "}"])
def test_a_checkpoint_tokenizer_record_the_parser_cannot_hold_is_one_error(value: str) -> None:
    from smelt_interp.data.bpe import checkpoint_tokenizer, tokenizer_hash

    with pytest.raises(TokenizerError):
        checkpoint_tokenizer({"tokenizer": {"json": value, "hash": tokenizer_hash(value)}})


# ----- a shards folder: its manifest, tokenizer and shards ------------------------------------
@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepared_bpe_shards(tmp_path_factory.mktemp("round5_shards"))


def copy_of(shards: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(shards, tmp_path / "shards"))


@pytest.mark.parametrize(
    "manifest",
    [DEEP, f'{{"shards": [], "n": {HUGE}}}', "FILE_NUMBER", "FILE_LIST"],
)
def test_a_manifest_the_parser_cannot_hold_or_a_shard_name_not_a_name_is_one_error(
    shards: Path, tmp_path: Path, manifest: str
) -> None:
    folder = copy_of(shards, tmp_path)
    if manifest.startswith("FILE_"):
        data = json.loads((folder / MANIFEST).read_text())
        data["shards"][0]["file"] = 12345 if manifest == "FILE_NUMBER" else ["a", "b"]
        manifest = json.dumps(data)
    (folder / MANIFEST).write_text(manifest)
    with pytest.raises(DataError) as info:
        ShardSet(folder)
    assert "\n" not in str(info.value) and str(folder) in str(info.value)


def within(seconds: float, call) -> BaseException | None:
    """What `call()` raised (None: nothing), run in a daemon thread that a blocking read cannot
    keep past `seconds` (a TimeoutError is returned then; the thread is left blocked)."""
    import threading

    raised: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
            raised.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            raised.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    return raised[0] if raised else TimeoutError(f"still blocked after {seconds} s")


def fifo_in(shards: Path, tmp_path: Path, name: str) -> tuple[Path, str]:
    folder = copy_of(shards, tmp_path)
    if name == "SHARD":
        name = json.loads((folder / MANIFEST).read_text())["shards"][0]["file"]
    (folder / name).unlink()
    fifo(folder / name)
    return folder, name


@pytest.mark.parametrize("name", [MANIFEST, TOKENIZER_FILE, "SHARD"])
def test_a_shards_folder_holding_a_fifo_is_refused_without_blocking(
    shards: Path, tmp_path: Path, name: str
) -> None:
    folder, name = fifo_in(shards, tmp_path, name)
    raised = within(20, lambda: ShardSet(folder))
    assert isinstance(raised, DataError) and "not a regular file" in str(raised), raised
    assert name in str(raised)


def test_train_shards_refuses_a_fifo_manifest_in_one_line(shards: Path, tmp_path: Path) -> None:
    folder, name = fifo_in(shards, tmp_path, MANIFEST)
    code, _, err = run_bounded(
        "smelt_interp.train", "--preset", "bpe-small", "--shards", folder, "--out",
        tmp_path / "run", "--quiet", "--set", "threads=1", timeout=90,
    )  # fmt: skip
    assert_one_line_error(code, err, name)


@pytest.mark.parametrize("record", ["FIFO", DEEP, f'{{"version": {HUGE}}}'])
def test_gather_refuses_a_record_it_cannot_read_without_blocking(
    tmp_path: Path, record: str
) -> None:
    stage = tmp_path / "stage"
    root = tmp_path / "root"
    (root / "a.md").parent.mkdir(parents=True)
    (root / "a.md").write_text("some documentation text " * 10)
    stage.mkdir()
    if record == "FIFO":
        fifo(stage / GATHER_FILE)
    else:
        (stage / GATHER_FILE).write_text(record)
    code, _, err = run_bounded(
        DATA, "gather", "--out", stage, "--root", f"docs={root}", "--quiet", "--workers", "1",
        timeout=90,
    )  # fmt: skip
    assert_one_line_error(code, err, GATHER_FILE)


# ----- train: resume on a folder prepared again -----------------------------------------------
def test_a_resume_on_shards_prepared_again_with_another_tokenizer_is_refused(
    tmp_path: Path,
) -> None:
    """The same folder, the same vocabulary size, another BPE: the run's config is unchanged,
    but its ids now name other tokens, so the resume is refused and nothing is saved."""
    from smelt_interp.train.trainer import Trainer

    (tmp_path / "a").mkdir()
    folder = prepared_bpe_shards(tmp_path / "a")
    run = tmp_path / "run"
    trained_on_shards(folder, run, steps=2)
    first = ShardSet(folder).tokenizer
    saved = {p.name: digest(p) for p in run.iterdir() if p.is_file()}
    shutil.rmtree(folder)
    texts = [t[::-1] for t in sample_texts()]  # other merges, the same size
    src = jsonl(tmp_path / "b" / "prose.jsonl", texts * 3)
    jsonl(tmp_path / "b" / "code.jsonl", texts * 3)
    prepare([f"code={tmp_path / 'b' / 'code.jsonl'}", f"prose={src}"], folder,
            f"bpe:{BPE_VOCAB}", shard_tokens=2000)  # fmt: skip
    again = ShardSet(folder).tokenizer
    assert isinstance(again, BpeTokenizer) and again.vocab_size == first.vocab_size
    assert again.json != first.json
    cfg = _tiny_train_config(folder, {"code": 1.0, "prose": 1.0}, first.vocab_size)
    with pytest.raises(CheckpointError, match="cannot resume.*tokenizer"):
        Trainer(cfg, run, resume=True, progress=False).run()
    assert {p.name: digest(p) for p in run.iterdir() if p.is_file()} == saved


# ----- the curves' run names ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b"),
    [("a/tiny/baseline", "b/tiny/baseline"), ("x/runs/smelt", "y/runs/smelt"),
     ("tiny/baseline", "deeper/tiny/baseline")],
)  # fmt: skip
def test_two_output_folders_of_one_name_get_distinct_run_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, a: str, b: str
) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_name(a) != run_name(b)
    assert run_name(a).endswith("/" + Path(a).name) and Path(a).parent.name in run_name(a)
    assert run_name(a) == run_name(tmp_path / a) == run_name(f"./{a}/../{Path(a).name}")
