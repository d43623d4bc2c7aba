"""Shared fixtures: the real tokenizer folders the project builds from the package registries
(scripts/build_test_data.py, tests/data/tokenizers.toml) and test-built ones."""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

import pytest

from proxy.core.tokenizer import LoadedTokenizer, load_tokenizer
from tests.lifetimes import note_order, release_finished

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("ISLWATCH_CACHE", Path.home() / ".cache" / "islwatch"))
# Built by scripts/build_test_data.py (scripts/test.sh runs it and exports the folder), byte-identical to the
# manifest tests/data/tokenizers.toml; tests/ops/test_test_data.py checks them against it.
TEST_DATA = Path(os.environ.get("ISLWATCH_TEST_DATA", CACHE / "test-data"))
TEST_TOKENIZERS = TEST_DATA / "tokenizers"
FAMILIES = [
    "mistral-7b-instruct-v0.1",
    "qwen2.5-instruct",
    "llama-3-8b-instruct",
    "phi-3-mini-4k-instruct",
    "tinyllama-1.1b-chat-v1.0",
    "smollm2-135m-instruct",
    "deepseek-v3",
]
NO_TEST_DATA = f"test tokenizers not built at {TEST_TOKENIZERS}: run python3 scripts/build_test_data.py (scripts/test.sh does)"


def unavailable(reason: str) -> NoReturn:
    """A server, venv or the built test data a test needs is missing: a skip with the reason here, a failure
    under CI (env `CI` set), where every server and the test data must be installed."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: what a test needs missing fails, never skips)", pytrace=False)
    pytest.skip(reason)


def shared_dir(family: str) -> Path:
    """One of the twelve real tokenizer folders (the families of the shared SOURCES.md), as built here."""
    path = TEST_TOKENIZERS / family
    if not path.is_dir():
        unavailable(NO_TEST_DATA)
    return path


def shared_dirs(families: Iterable[str]) -> dict[str, Path]:
    return {family: shared_dir(family) for family in families}


@cache
def _load(spec: str) -> LoadedTokenizer:
    return load_tokenizer(spec)


def load_shared(family: str) -> LoadedTokenizer:
    """Each shared tokenizer is loaded once per test session."""
    return _load(str(shared_dir(family)))


def load_builtin() -> LoadedTokenizer:
    return _load("builtin:mistral-v0.1")


@cache
def served_by_llama_cpp(family: str) -> Any:
    """A shared tokenizer as the llama.cpp flavor serves it: a copy (seconds of CPU for a large vocabulary),
    made once per test session."""
    from proxy.core.flavors import flavor_named

    return flavor_named("llama.cpp").served_tokenizer(load_shared(family).tokenizer)


@pytest.fixture(params=FAMILIES)
def shared_family(request: pytest.FixtureRequest) -> str:
    shared_dir(request.param)
    return request.param


@pytest.fixture
def shared_tok(shared_family: str) -> Any:
    return load_shared(shared_family).tokenizer


# The test lanes. `pytest -m fast`: what needs no real server (llama-server, vLLM, SGLang, Prometheus) and is
# not marked slow, for the development loop; `pytest`: the whole suite, as CI runs it. Marked here, once per
# test, so a test is fast unless it says otherwise or sits in a folder of live servers.
TESTS = Path(__file__).resolve().parent
SERVER_FOLDERS = frozenset({"interop", "sglang_server", "vllm_oracle", "vllm_server", "vllm_vision"})
NOT_FAST = ("llama_server", "vllm", "sglang", "prometheus", "slow")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """`-m fast` does not even import the live-server folders (their modules load vLLM's and SGLang's
    shapes); None: pytest decides as usual."""
    if config.getoption("markexpr") != "fast" or not collection_path.is_dir():
        return None
    return (collection_path.resolve().parent == TESTS and collection_path.name in SERVER_FOLDERS) or None


def pytest_itemcollected(item: pytest.Item) -> None:
    folder = item.path.resolve().relative_to(TESTS).parts[0]
    if folder not in SERVER_FOLDERS and not any(item.get_closest_marker(m) for m in NOT_FAST):
        item.add_marker(pytest.mark.fast)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """One test folder after another, each in the order pytest chose for it. pytest groups tests by the params
    of session fixtures, and the `family` of interop, sglang_server, vllm_oracle and vllm_server share values:
    folders interleave, and every folder's servers are up at once (SGLang's nine oracle processes beside the
    four live vLLM servers: a vLLM server was killed by the kernel's OOM killer on this 23 GB machine).
    Grouped, tests/lifetimes.py stops each folder's servers before the next folder starts its own."""
    items.sort(key=lambda item: item.path.resolve().parent.as_posix())


def pytest_collection_finish(session: pytest.Session) -> None:
    note_order([(item.nodeid, item.path) for item in session.items])


def pytest_runtest_teardown(item: pytest.Item) -> None:
    release_finished(item.nodeid)
