"""Tokenizer identity hashes what was loaded: for `REPO@REV` the hub snapshot of that revision, every file the
tokenizer read, and never the hash of nothing.

The hub is unreachable: a hub cache is laid out by hand (refs/, snapshots/, .no_exist/, as huggingface_hub
writes it) and `islwatch count` runs on it as a user runs it, with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from proxy.core.tokenizer import SERIALISED, TokenizerLoadError, file_hashes, load_tokenizer
from tests.builders import build_tokenizer, save_tokenizer
from tests.lanes import sweep

REPO = Path(__file__).resolve().parents[2]
MAIN, V1 = "a" * 40, "b" * 40  # commit hashes of the two snapshots
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hello there"}]}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _snapshot_hashes(folder: Path) -> dict[str, str]:
    return {p.name: _sha(p) for p in folder.iterdir() if p.is_file()}


@pytest.fixture
def hub(tmp_path: Path) -> Path:
    """A hub cache holding acme/tiny: `main` -> a chatml tokenizer, tag `v1` -> a llama3 one."""
    repo = tmp_path / "hub" / "models--acme--tiny"
    for commit, style in ((MAIN, "chatml"), (V1, "llama3")):
        save_tokenizer(style, str(repo / "snapshots" / commit))
        (repo / ".no_exist" / commit).mkdir(parents=True)
        (repo / ".no_exist" / commit / "config.json").touch()  # cached as absent: no lookup
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "v1").write_text(V1)
    return tmp_path / "hub"


def _identity(hub: Path, tmp_path: Path, *args: str) -> dict[str, Any]:
    body = tmp_path / "body.json"
    body.write_text(json.dumps(CHAT))
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "count", *args, str(body)],
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    identity: dict[str, Any] = json.loads(proc.stdout)["tokenizer"]
    return identity


@pytest.mark.parametrize(
    "args",
    # an islwatch process each: the fast lane runs the REPO@REV form
    sweep(
        [("--tokenizer", "acme/tiny@v1"), ("--tokenizer", "acme/tiny", "--revision", "v1")],
        ids=["at-revision", "revision-flag"],
    ),
)
def test_a_revision_is_hashed_from_its_own_snapshot(hub: Path, tmp_path: Path, args: tuple[str, ...]) -> None:
    got = _identity(hub, tmp_path, *args)
    snapshots = hub / "models--acme--tiny" / "snapshots"
    assert got["revision"] == "v1"
    assert got["files"] == _snapshot_hashes(snapshots / V1)
    assert got["files"] != _snapshot_hashes(snapshots / MAIN)


def test_main_is_hashed_from_main(hub: Path, tmp_path: Path) -> None:
    got = _identity(hub, tmp_path, "--tokenizer", "acme/tiny")
    assert got["files"] == _snapshot_hashes(hub / "models--acme--tiny" / "snapshots" / MAIN)


@pytest.mark.slow  # a process; the fast lane hashes a revision and main above
def test_a_commit_without_a_main_ref_is_still_hashed(hub: Path, tmp_path: Path) -> None:
    """A cache that only holds a pinned commit (no refs/main): the files are still found, not skipped."""
    (hub / "models--acme--tiny" / "refs" / "main").unlink()
    got = _identity(hub, tmp_path, "--tokenizer", f"acme/tiny@{V1}")
    assert got["files"] == _snapshot_hashes(hub / "models--acme--tiny" / "snapshots" / V1)
    assert got["tokenizer_sha256"] != hashlib.sha256(b"").hexdigest()


def _wordpiece(folder: Path, words: list[str]) -> str:
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}))
    return str(folder)


def test_a_vocabulary_file_outside_the_usual_names_is_hashed(tmp_path: Path) -> None:
    """A WordPiece tokenizer reads vocab.txt: two vocabularies are two identities."""
    a = load_tokenizer(_wordpiece(tmp_path / "a", ["hello", "world"]))
    b = load_tokenizer(_wordpiece(tmp_path / "b", ["hello", "there"]))
    assert a.tokenizer("hello world").input_ids != b.tokenizer("hello world").input_ids  # really differ
    assert a.identity.files["vocab.txt"] == _sha(tmp_path / "a" / "vocab.txt")
    assert a.identity.tokenizer_sha256 != b.identity.tokenizer_sha256


def test_files_that_cannot_be_found_are_reported_and_the_loaded_form_hashed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No snapshot of this id in any cache: the identity says the files were not hashed and pins the
    loaded tokenizer itself, so two different tokenizers still differ."""
    with caplog.at_level(logging.WARNING, logger="islwatch.tokenizer"):
        chatml = file_hashes(build_tokenizer("chatml"), "acme/absent", None)
        llama3 = file_hashes(build_tokenizer("llama3"), "acme/absent", None)
    assert list(chatml) == [SERIALISED] and chatml != llama3
    assert chatml == file_hashes(build_tokenizer("chatml"), "acme/absent", None)
    assert any("files not hashed" in r.getMessage() for r in caplog.records)


def test_an_unwritable_cache_for_a_builtin_is_a_load_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a NotADirectoryError out of the loader (that crashed analysis workers while loading)."""
    cache = tmp_path / "not-a-dir"
    cache.write_text("")
    monkeypatch.setenv("ISLWATCH_CACHE", str(cache))
    with pytest.raises(TokenizerLoadError, match="cannot write built-in tokenizer"):
        load_tokenizer("builtin:mistral-v0.1")
