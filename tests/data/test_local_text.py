"""`gather`: the text this machine holds as a staged corpus. Small trees under tmp_path with
the expected documents written down by hand: domains by suffix, gzip, the skips, duplicates
across domains, the shared byte budget, resume and refusal of the staging folder, the empty
machine as one line, `--shards` tokens against the shards themselves, and the default roots."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from helpers.bad_input import assert_one_line_error, run_command

from smelt_interp.data import local_text
from smelt_interp.data.local_text import (
    EVERY_FILE,
    GATHER_FILE,
    SKIP_REASONS,
    Root,
    default_roots,
    gather,
    list_files,
)
from smelt_interp.data.prepare import prepare
from smelt_interp.data.shards import ShardSet
from smelt_interp.errors import DataError


def text(tag: str, n: int = 100) -> str:
    """A unique ASCII text of exactly `n` bytes."""
    return (f"{tag}: " + "x" * n)[:n]


def tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, body in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body if isinstance(body, bytes) else body.encode("utf-8"))
    return root


def staged(out: Path) -> dict[str, dict[str, str]]:
    """{domain: {id: text}} of a staging folder, read from its JSONL parts."""
    docs: dict[str, dict[str, str]] = {}
    for part in sorted(out.glob("*/part-*.jsonl")):
        for line in part.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            assert record["domain"] == part.parent.name
            docs.setdefault(record["domain"], {})[record["id"]] = record["text"]
    return docs


def no_skips(**counts: int) -> dict[str, int]:
    return {reason: counts.get(reason, 0) for reason in SKIP_REASONS}


def test_domains_take_their_suffixes_and_gzip_is_read(tmp_path):
    py = tree(
        tmp_path / "py",
        {"a.py": text("a"), "a.md": text("a.md"), "a.h": text("a.h"), "sub/b.py": text("b")},
    )
    docs = tree(
        tmp_path / "docs",
        {
            "README": text("readme"),
            "guide.rst": text("guide"),
            "notes.txt": text("notes"),
            "page.md": text("page"),
            "page.html": text("html"),
            "code.py": text("code"),
            ".hidden.md": text("hidden"),
        },
    )
    (docs / "NEWS.gz").write_bytes(gzip.compress(text("news", 300).encode()))
    hdr = tree(
        tmp_path / "hdr",
        {f"x{s}": text(s) for s in (".h", ".hh", ".hpp", ".hxx", ".cuh", ".inl", ".c")},
    )
    (hdr / "__pycache__").mkdir()
    (hdr / "__pycache__" / "y.h").write_text(text("cached"))
    other = tree(tmp_path / "other", {"o.py": text("o.py"), "o.h": text("o.h"), "o": text("o")})
    roots = [f"python={py}", f"docs={docs}", f"headers={hdr}", f"notes={other}"]
    stats = gather(tmp_path / "out", roots, workers=2)
    assert staged(tmp_path / "out") == {
        "python": {"py/a.py": text("a"), "py/sub/b.py": text("b")},
        "docs": {
            "docs/NEWS.gz": text("news", 300),
            "docs/README": text("readme"),
            "docs/guide.rst": text("guide"),
            "docs/notes.txt": text("notes"),
            "docs/page.md": text("page"),
        },
        "headers": {f"hdr/x{s}": text(s) for s in (".cuh", ".h", ".hh", ".hpp", ".hxx", ".inl")},
        "notes": {"other/o.h": text("o.h"), "other/o.py": text("o.py")},
    }
    assert stats.sources() == [
        f"{d}={tmp_path / 'out' / d}" for d in ("docs", "headers", "notes", "python")
    ]
    assert stats.domains["docs"].bytes == 4 * 100 + 300
    assert all(s.skipped == no_skips() for s in stats.domains.values())


def test_a_system_doc_folder_takes_every_file_and_the_defaults_are_the_machines(tmp_path):
    folder = tree(tmp_path / "doc", {"pkg/copyright": "c", "pkg/a.html": "h", "pkg/x.gz": "z"})
    (folder / "pkg" / "link").symlink_to(folder / "pkg" / "copyright")
    (folder / "loop").symlink_to(folder, target_is_directory=True)
    tasks = list_files([Root("docs", folder, (EVERY_FILE,))])
    assert [t[1] for t in tasks["docs"]] == ["doc/pkg/a.html", "doc/pkg/copyright", "doc/pkg/x.gz"]
    roots = {(r.domain, r.path, r.suffixes) for r in default_roots()}
    assert ("docs", Path("/usr/share/doc"), (EVERY_FILE,)) in roots
    assert ("headers", Path("/usr/include"), local_text.HEADER_SUFFIXES) in roots
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    assert {("python", stdlib, (".py",)), ("docs", stdlib, (".md", ".rst", ".txt"))} <= roots


def test_small_large_binary_and_foreign_files_are_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(local_text, "MAX_FILE_BYTES", 1000)  # read in this process: workers=1
    src = tree(
        tmp_path / "src",
        {
            "small.py": text("s", 63),
            "edge.py": text("e", 64),
            "large.py": text("l", 1001),
            "max.py": text("m", 1000),
            "nul.py": text("n") + "\0",
            "latin.py": ("café " * 30).encode("latin-1"),
            "utf8.py": "café ✓ 日本 " * 10,
            "again.py": text("e", 64),
        },
    )
    (src / "big.py.gz").write_bytes(gzip.compress(b"a" * 2000))
    (src / "bad.gz").write_bytes(b"not gzip at all" * 10)
    roots = [f"python={src}", f"docs={src}"]
    stats = gather(tmp_path / "out", roots, workers=1)
    assert set(staged(tmp_path / "out")["python"]) == {
        "src/again.py",
        "src/max.py",
        "src/utf8.py",
    }  # again.py sorts first
    assert stats.domains["python"].skipped == no_skips(
        too_small=1, too_large=1, not_utf8=1, binary=1, duplicate=1
    )
    assert stats.domains["docs"].skipped == no_skips(too_large=1, unreadable=1)
    assert stats.domains["docs"].documents == 0 and stats.sources() == [
        f"python={tmp_path / 'out' / 'python'}"
    ]


def test_a_duplicate_is_kept_once_across_domains(tmp_path):
    same = text("shared", 200)
    a = tree(tmp_path / "a", {"x.py": same, "y.py": text("y")})
    b = tree(tmp_path / "b", {"x.md": same, "z.md": text("z")})
    c = tree(tmp_path / "c", {"x.h": same, "copy.h": same})
    (a / "z_link.py").symlink_to(a / "y.py")  # the same file: listed once
    stats = gather(tmp_path / "out", [f"python={a}", f"docs={b}", f"headers={c}"], workers=2)
    assert staged(tmp_path / "out") == {
        "docs": {"b/x.md": same, "b/z.md": text("z")},  # docs is read first
        "python": {"a/y.py": text("y")},
    }
    assert stats.domains["python"].skipped["duplicate"] == 1
    assert stats.domains["headers"].skipped["duplicate"] == 2
    assert stats.domains["python"].files == 2


def budget_tree(root: Path) -> list[str]:
    tree(root / "d", {f"d{i}.md": text(f"d{i}") for i in range(2)})
    tree(root / "h", {f"h{i:02d}.h": text(f"h{i}") for i in range(20)})
    tree(root / "p", {f"p{i:02d}.py": text(f"p{i}") for i in range(20)})
    return [f"docs={root / 'd'}", f"headers={root / 'h'}", f"python={root / 'p'}"]


@pytest.mark.parametrize("max_bytes", [1200, 1299])
def test_the_budget_is_shared_and_what_a_domain_leaves_goes_to_the_others(tmp_path, max_bytes):
    roots = budget_tree(tmp_path)
    # share 400 (433) each; docs holds 200, so headers and python get 500 (549) each
    runs = [gather(tmp_path / f"out{w}", roots, max_bytes=max_bytes, workers=w) for w in (1, 2)]
    docs = staged(tmp_path / "out1")
    assert docs == staged(tmp_path / "out2")
    assert sorted(docs["docs"]) == ["d/d0.md", "d/d1.md"]
    assert sorted(docs["headers"]) == [f"h/h{i:02d}.h" for i in range(5)]
    assert sorted(docs["python"]) == [f"p/p{i:02d}.py" for i in range(5)]
    for stats in runs:
        assert stats.bytes == 1200 <= max_bytes
        assert [stats.domains[d].budget_reached for d in ("docs", "headers", "python")] == [
            False,
            True,
            True,
        ]
    parts = sorted((tmp_path / "out1").rglob("*.jsonl"))
    assert [p.read_bytes() for p in parts] == [
        (tmp_path / "out2" / p.relative_to(tmp_path / "out1")).read_bytes() for p in parts
    ]


def test_a_finished_gather_is_reused_and_other_folders_are_refused(tmp_path, monkeypatch):
    roots = budget_tree(tmp_path)
    out = tmp_path / "out"
    first = gather(out, roots, max_bytes=1200, workers=1)
    assert not first.reused
    monkeypatch.setattr(local_text, "list_files", lambda _: pytest.fail("gathered again"))
    again = gather(out, roots, max_bytes=1200, workers=2)
    assert again.reused and again.domains == first.domains
    with pytest.raises(DataError, match="other roots or budget"):
        gather(out, roots, max_bytes=1300)
    with pytest.raises(DataError, match="other roots or budget"):
        gather(out, roots[:2], max_bytes=1200)
    (out / GATHER_FILE).unlink()
    with pytest.raises(DataError, match="not a finished gather"):
        gather(out, roots, max_bytes=1200)
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match="a file, not a folder"):
        gather(tmp_path / "file", roots)
    with pytest.raises(DataError, match="inside the root"):
        gather(tmp_path / "p" / "stage", roots)


def test_an_interrupted_gather_leaves_nothing_that_looks_done(tmp_path, monkeypatch):
    roots = budget_tree(tmp_path)
    original, calls = local_text._Parts.write, {"n": 0}

    def dying_write(self, line):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt("simulated kill")
        original(self, line)

    monkeypatch.setattr(local_text._Parts, "write", dying_write)
    with pytest.raises(KeyboardInterrupt):
        gather(tmp_path / "out", roots, workers=1)
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(local_text._Parts, "write", original)
    stats = gather(tmp_path / "out", roots, workers=1)
    assert stats.documents == 42 and not stats.reused


def test_an_empty_machine_is_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    binary = tree(tmp_path / "bin", {"a.py": b"\0\1\2" * 50, "b.h": b"\xff\xfe" * 50})
    cases = {
        "empty": [f"python={empty}", f"docs={empty}"],
        "binary": [f"python={binary}", f"headers={binary}"],
    }
    for name, roots in cases.items():
        out = tmp_path / f"out-{name}"
        args = [a for r in roots for a in ("--root", r)]
        code, _, err = run_command(
            "smelt_interp.data", "gather", "--out", out, *args, "--workers", "2"
        )
        assert_one_line_error(code, err, "no text found on this machine", "nothing to gather")
        assert not out.exists()
    with pytest.raises(DataError, match="looked under no roots"):
        gather(tmp_path / "out", [])


def test_bad_flags_are_one_line(tmp_path):
    cases = {
        ("--max-bytes", "lots"): "byte count",
        ("--workers", "0"): "--workers",
        ("--tokenizer", "bytes"): "need --shards",
        ("--root", "bad!=."): "a domain is letters",
        ("--root", f"python={tmp_path / 'none'}"): "no such file",
        ("--shards", tmp_path / "out"): "--shards",
    }
    for flags, needle in cases.items():
        code, _, err = run_command("smelt_interp.data", "gather", "--out", tmp_path / "out", *flags)
        assert_one_line_error(code, err, needle)


def test_parse_bytes_reads_binary_suffixes():
    from smelt_interp.data.__main__ import parse_bytes

    assert [parse_bytes(s) for s in ("1000", "200k", "512M", "2G", "1.5GiB", "3 MB")] == [
        1000,
        200 << 10,
        512 << 20,
        2 << 30,
        3 << 29,
        3 << 20,
    ]


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe:300"])
def test_shards_hold_the_tokens_the_json_reports(tmp_path, tokenizer):
    roots = budget_tree(tmp_path)
    tree(tmp_path / "p", {"unicode.py": "naïve café ✓ 日本語 🙂 " * 8})
    stage, shards, record = tmp_path / "stage", tmp_path / "shards", tmp_path / "rec.json"
    args = ["--out", stage, "--workers", "2", "--shards", shards, "--tokenizer", tokenizer]
    args += [a for r in roots for a in ("--root", r)] + ["--json", record, "--quiet"]
    code, out, err = run_command("smelt_interp.data", "gather", *args)
    assert code == 0, err
    data = json.loads(record.read_text())
    shard_set = ShardSet(shards)
    counted = {
        d: sum(
            s.header.n_tokens for split in ("train", "heldout") for s in shard_set.select(d, split)
        )
        for d in ("docs", "headers", "python")
    }
    assert {d: v["tokens"] for d, v in data["domains"].items()} == counted
    assert data["unique_tokens"] == sum(counted.values()) > 0
    assert f"unique tokens: {data['unique_tokens']:,}" in out
    assert data["documents"] == 43 and data["tokenizer"] == tokenizer
    if tokenizer == "bytes":  # a BOS, then one token a byte
        assert data["unique_tokens"] == data["bytes"] + data["documents"]
    assert set(data) >= {"roots", "gather_seconds", "prepare_seconds", "bytes"}
    # the same shards as prepare run on the staged folders
    again = tmp_path / "again"
    prepare([f"{d}={stage / d}" for d in ("docs", "headers", "python")], again, tokenizer)
    names = sorted(p.name for p in shards.glob("*.tok"))
    assert names == sorted(p.name for p in again.glob("*.tok"))
    assert all((shards / n).read_bytes() == (again / n).read_bytes() for n in names)
    code, out, err = run_command("smelt_interp.data", "gather", *args)
    assert code == 0 and "already gathered" in out and "already prepared" in out
    assert json.loads(record.read_text())["unique_tokens"] == data["unique_tokens"]


def test_the_default_roots_find_text_on_this_machine(tmp_path):
    record = tmp_path / "rec.json"
    code, out, err = run_command(
        "smelt_interp.data",
        "gather",
        "--out",
        tmp_path / "stage",
        "--max-bytes",
        "200k",
        "--workers",
        "2",
        "--json",
        record,
        "--quiet",
    )
    assert code == 0, err
    data = json.loads(record.read_text())
    assert 0 < data["bytes"] <= 200 << 10
    assert data["domains"]["python"]["documents"] > 0
    assert "tokens" not in data["domains"]["python"] and data["unique_tokens"] is None
    paths = {r["path"] for r in data["roots"] if r["domain"] == "python"}
    assert str(Path(os.__file__).parent.resolve()) in paths
