"""Session fixtures: one SGLang oracle per family (SGLang's own chat preprocessing in a long-lived
subprocess, tests/sglang_server/sglang_proc.py), and one more for the families of DEFAULT_KWARGS (started with
`--default-chat-template-kwargs`), all starting at once (~1 GB resident each), stopped by pid when this
directory's last test is done.

Skips (with the reason; under CI, fails) only when SGLang cannot be installed here, or the shared
tokenizers are absent. An oracle that fails to start is a failure, not a skip.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.core.fast import best_encoder
from tests.conftest import TEST_TOKENIZERS, load_shared, shared_dirs, unavailable
from tests.lifetimes import release_after_directory
from tests.sglang_server.sglang_proc import (
    DEFAULT_KWARGS,
    FAMILIES,
    Oracle,
    Oracles,
    SglangUnavailable,
    find_python,
    launch,
    stop,
)
from tests.vllm_oracle.oracle_proc import model_folder


@pytest.fixture(scope="session")
def sglang_python() -> str:
    try:
        return find_python()
    except SglangUnavailable as exc:
        unavailable(str(exc))


@pytest.fixture(scope="session")
def all_oracles(sglang_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Oracles]:
    shared_dirs(FAMILIES)  # the built test tokenizers: a skip when absent, a failure under CI
    logs = tmp_path_factory.mktemp("sglang")
    cache = Path(sglang_python).parents[1] / "oracle-models"  # next to the venv
    folders = {family: model_folder(cache, family, TEST_TOKENIZERS) for family in FAMILIES}
    started = Oracles({}, {})
    try:
        for family, folder in folders.items():
            started.plain[family] = launch(sglang_python, family, folder, logs / f"{family}.log")
        for family, kwargs in DEFAULT_KWARGS.items():
            log = logs / f"{family}-default-kwargs.log"
            started.default_kwargs[family] = launch(sglang_python, family, folders[family], log, kwargs)
        for oracle in [*started.plain.values(), *started.default_kwargs.values()]:
            oracle.wait_ready()
            release_after_directory(Path(__file__).parent, functools.partial(stop, oracle))
        yield started
    finally:
        for oracle in [*started.plain.values(), *started.default_kwargs.values()]:
            stop(oracle)


@pytest.fixture(scope="session")
def oracles(all_oracles: Oracles) -> dict[str, Oracle]:
    return all_oracles.plain


@pytest.fixture(scope="session", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def oracle(oracles: dict[str, Oracle], family: str) -> Oracle:
    return oracles[family]


@pytest.fixture(scope="session")
def encoder(family: str) -> Any:
    """The encoder the proxy and `islwatch count` use (the fast one, where proven at load)."""
    return best_encoder(load_shared(family).tokenizer)
