"""Session fixtures: one SGLang oracle per family (SGLang's own chat preprocessing in a long-lived
subprocess, tests/sglang_server/sglang_proc.py), all starting at once, stopped by pid at the end.

Skips (with the reason; under CI, fails) only when SGLang cannot be installed here, or the shared
tokenizers are absent. An oracle that fails to start is a failure, not a skip.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sglang_proc import FAMILIES, Oracle, SglangUnavailable, find_python, launch, stop
from vllm_server.vllm_proc import tiny_model

from proxy.core.fast import best_encoder
from tests.conftest import SHARED_TOKENIZERS, load_shared, unavailable
from tests.lifetimes import release_after_directory


@pytest.fixture(scope="session")
def sglang_python() -> str:
    try:
        return find_python()
    except SglangUnavailable as exc:
        unavailable(str(exc))


@pytest.fixture(scope="session")
def oracles(sglang_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Oracle]]:
    missing = [f for f in FAMILIES if not (SHARED_TOKENIZERS / f).is_dir()]
    if missing:
        pytest.skip(f"shared tokenizers not present in {SHARED_TOKENIZERS}: {missing}")
    logs = tmp_path_factory.mktemp("sglang")
    started: dict[str, Oracle] = {}
    try:
        for family in FAMILIES:
            # The tiny model builder of the vLLM tests, run in the SGLang venv (it has torch and
            # transformers): SGLang reads the model's config and tokenizer files, never its weights here.
            model = tiny_model(sglang_python, SHARED_TOKENIZERS / family, family)
            started[family] = launch(sglang_python, family, model, logs / f"{family}.log")
        for oracle in started.values():
            oracle.wait_ready()
            release_after_directory(Path(__file__).parent, functools.partial(stop, oracle))
        yield started
    finally:
        for oracle in started.values():
            stop(oracle)


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
