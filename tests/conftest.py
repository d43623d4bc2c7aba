"""Shared fixtures: real tokenizers from ../shared/tokenizers (skipped cleanly when absent) and test-built ones."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

import pytest

from proxy.core.tokenizer import LoadedTokenizer, load_tokenizer
from tests.lifetimes import note_order, release_finished

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ISLWATCH_SHARED", REPO.parent / "shared"))
SHARED_TOKENIZERS = SHARED / "tokenizers"
FIXTURES = SHARED / "fixtures"
FAMILIES = [
    "mistral-7b-instruct-v0.1",
    "qwen2.5-instruct",
    "llama-3-8b-instruct",
    "phi-3-mini-4k-instruct",
    "tinyllama-1.1b-chat-v1.0",
    "smollm2-135m-instruct",
    "deepseek-v3",
]
SKIP_SHARED = f"shared tokenizers not present at {SHARED_TOKENIZERS} (see ../shared/README.md)"


def unavailable(reason: str) -> NoReturn:
    """A server or venv a test needs is missing: a skip with the reason here, a failure under CI (env `CI`
    set), where every server must be installed and run."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: a missing server fails, never skips)", pytrace=False)
    pytest.skip(reason)


def shared_dir(family: str) -> Path:
    path = SHARED_TOKENIZERS / family
    if not path.is_dir():
        pytest.skip(SKIP_SHARED)
    return path


@cache
def _load(spec: str) -> LoadedTokenizer:
    return load_tokenizer(spec)


def load_shared(family: str) -> LoadedTokenizer:
    """Each shared tokenizer is loaded once per test session."""
    return _load(str(shared_dir(family)))


def load_builtin() -> LoadedTokenizer:
    return _load("builtin:mistral-v0.1")


@pytest.fixture(params=FAMILIES)
def shared_family(request: pytest.FixtureRequest) -> str:
    shared_dir(request.param)
    return request.param


@pytest.fixture
def shared_tok(shared_family: str) -> Any:
    return load_shared(shared_family).tokenizer


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
