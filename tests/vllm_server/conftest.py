"""Session fixtures: real vLLM servers (CPU build) around tiny random-weight models, started once, in
parallel, and stopped by pid at the end; one islwatch proxy in front of each.

Skips (with the reason; under CI, fails) only when vLLM cannot be installed here, or the shared
tokenizers are absent. A server that fails to start is a failure, not a skip.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_TOKENIZERS, load_shared, shared_dirs, unavailable
from tests.lifetimes import release_after_directory
from tests.server.helpers import Background, proxy_config
from tests.vllm_server.vllm_proc import (
    FAMILIES,
    PROBE_SERVER,
    PROBE_TOKENIZER,
    VllmServer,
    VllmUnavailable,
    find_python,
    free_port,
    launch,
    stop,
    tiny_model,
    vllm_version,
    wait_healthy,
)

EMBED_FAMILY = "qwen2.5-instruct"


@pytest.fixture(scope="session")
def vllm_python() -> str:
    try:
        return find_python()
    except VllmUnavailable as exc:
        unavailable(str(exc))


@pytest.fixture(scope="session")
def vllm_servers(
    vllm_python: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, VllmServer]]:
    """One chat server per family and one embedding server, all starting at once."""
    shared_dirs(
        [*FAMILIES, PROBE_TOKENIZER]
    )  # the built test tokenizers: a skip when absent, a failure under CI
    version = vllm_version(vllm_python)
    logs = tmp_path_factory.mktemp("vllm")
    wanted = [(f, False) for f in FAMILIES] + [(EMBED_FAMILY, True)]
    servers: dict[str, VllmServer] = {}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for family, embedding in wanted:
            key = f"{family}-embed" if embedding else family
            model = tiny_model(vllm_python, TEST_TOKENIZERS / family, family)
            server = VllmServer(family, model, free_port(), logs / f"{key}.log", version, embedding)
            procs[key] = launch(vllm_python, server)
            servers[key] = server
        for key, server in servers.items():
            wait_healthy(procs[key], server)
        for proc in procs.values():
            release_after_directory(Path(__file__).parent, functools.partial(stop, proc))
        yield servers
    finally:
        for proc in procs.values():
            stop(proc)


@pytest.fixture(scope="session", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def vllm(vllm_servers: dict[str, VllmServer], family: str) -> VllmServer:
    return vllm_servers[family]


@pytest.fixture(scope="session")
def vllm_embed(vllm_servers: dict[str, VllmServer]) -> VllmServer:
    return vllm_servers[f"{EMBED_FAMILY}-embed"]


@pytest.fixture(scope="session")
def family_tokenizer(family: str) -> Any:
    return load_shared(family).tokenizer


@pytest.fixture(scope="session")
def background() -> Iterator[Background]:
    bg = Background()
    yield bg
    bg.close()


def start_proxy(
    bg: Background, server: VllmServer, tokenizer: str | None = None, **overrides: Any
) -> tuple[str, str]:
    """An islwatch proxy (default vllm flavor) in front of one server, its model mapped to the shared
    tokenizer folder the tiny model was built around (or to `tokenizer`'s); `overrides`: config values."""
    from proxy.server.app import run_proxy

    cfg = proxy_config(
        server.base_url,
        tokenizer="none",
        model_tokenizers={server.model: str(TEST_TOKENIZERS / (tokenizer or server.family))},
        **overrides,
    )
    url, admin_url, _ = bg.enter(run_proxy(cfg))
    return url, admin_url


@pytest.fixture(scope="session")
def proxies(vllm_servers: dict[str, VllmServer], background: Background) -> dict[str, tuple[str, str]]:
    return {key: start_proxy(background, server) for key, server in vllm_servers.items()}


@pytest.fixture(scope="session")
def mistold_proxy(vllm_servers: dict[str, VllmServer], background: Background) -> tuple[str, str]:
    """A proxy in front of PROBE_SERVER told the wrong tokenizer, PROBE_TOKENIZER's."""
    return start_proxy(background, vllm_servers[PROBE_SERVER], PROBE_TOKENIZER)


@pytest.fixture(scope="session")
def proxied(proxies: dict[str, tuple[str, str]], family: str) -> tuple[str, str]:
    return proxies[family]
