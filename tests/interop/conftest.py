"""Session fixtures: one real llama-server per tiny GGUF model, started once and stopped at the end: two older
families (Qwen2.5, Llama-3: `family`) and two modern ones (Qwen3, gpt-oss: `modern_family`,
test_llama_server_modern.py), each GGUF built around its test tokenizer folder (scripts/build_tiny_gguf.sh).

Skips (with the reason) only when llama-server, a GGUF or the test tokenizers are absent and cannot be built;
under CI that is a failure too. A server that fails to start is a failure, not a skip.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.core.model import ServedModel, load_served_model
from tests.interop.llama_server_proc import (
    BUILT_GGUF,
    GGUF,
    BinaryUnavailable,
    LlamaServer,
    binary_version,
    find_binary,
    free_port,
    launch,
    stop,
    tiny_gguf,
    wait_healthy,
)
from tests.interop.proxy_proc import Proxy, running_proxy

FAMILIES = list(GGUF)
MODERN_FAMILIES = list(BUILT_GGUF)
ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


@pytest.fixture(scope="session")
def llama_server_binary(request: pytest.FixtureRequest) -> str:
    try:
        return find_binary()
    except BinaryUnavailable as exc:
        _root_conftest(request).unavailable(str(exc))  # a skip, a failure under CI


@pytest.fixture(scope="session")
def llama_servers(
    request: pytest.FixtureRequest, llama_server_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, LlamaServer]]:
    """Qwen2.5 and Llama 3: tiny GGUFs built from the test tokenizers (scripts/build_tiny_gguf.sh, cached).
    Both models load in parallel (one thread each); each is healthy before any test uses it."""
    ggufs = {family: tiny_gguf(family) for family in GGUF}
    version = binary_version(llama_server_binary)
    logs = tmp_path_factory.mktemp("llama-server")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    servers: dict[str, LlamaServer] = {}
    try:
        for family, gguf in ggufs.items():
            port = free_port()
            log_path = logs / f"{family}.log"
            procs[family] = launch(llama_server_binary, gguf, port, log_path)
            servers[family] = LlamaServer(family, gguf, port, log_path, version)
        for family, server in servers.items():
            wait_healthy(procs[family], server.base_url, server.log_path)
        yield servers
    finally:
        for proc in procs.values():
            stop(proc)


@pytest.fixture(scope="session")
def modern_servers(
    request: pytest.FixtureRequest, llama_server_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, LlamaServer]]:
    """Qwen3 and gpt-oss: tiny GGUFs built from the shared tokenizers (scripts/build_tiny_gguf.sh, cached),
    each served by its own llama-server, loading in parallel."""
    ggufs = {family: tiny_gguf(family) for family in BUILT_GGUF}
    version = binary_version(llama_server_binary)
    logs = tmp_path_factory.mktemp("llama-server-modern")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    servers: dict[str, LlamaServer] = {}
    try:
        for family, gguf in ggufs.items():
            port = free_port()
            log_path = logs / f"{family}.log"
            procs[family] = launch(llama_server_binary, gguf, port, log_path)
            servers[family] = LlamaServer(family, gguf, port, log_path, version)
        for family, server in servers.items():
            wait_healthy(procs[family], server.base_url, server.log_path)
        yield servers
    finally:
        for proc in procs.values():
            stop(proc)


@pytest.fixture(scope="session", params=MODERN_FAMILIES)
def modern_family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def modern_server(modern_servers: dict[str, LlamaServer], modern_family: str) -> LlamaServer:
    return modern_servers[modern_family]


@pytest.fixture(scope="session")
def modern_model(request: pytest.FixtureRequest, modern_family: str) -> ServedModel:
    """islwatch's model of the same server: the shared tokenizer folder under `--server-flavor llama.cpp`."""
    return load_served_model(str(_root_conftest(request).shared_dir(modern_family)), "llama.cpp")


@pytest.fixture(scope="session", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def llama_server(llama_servers: dict[str, LlamaServer], family: str) -> LlamaServer:
    return llama_servers[family]


@pytest.fixture(scope="session")
def family_tokenizer(request: pytest.FixtureRequest, family: str) -> Any:
    """Through tests/conftest.py's loader (found by its plugin name: a second `import conftest` here would
    import this file), so each tokenizer is loaded once per session for the whole suite."""
    return _root_conftest(request).load_shared(family).tokenizer


def _root_conftest(request: pytest.FixtureRequest) -> Any:
    module = request.config.pluginmanager.get_plugin(str(ROOT_CONFTEST))
    if module is None:
        raise RuntimeError(f"{ROOT_CONFTEST} is not loaded")
    return module


@pytest.fixture(scope="session")
def llama_proxy(
    request: pytest.FixtureRequest, llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxy]:
    tokenizer = str(request.getfixturevalue("family_tokenizer").name_or_path)
    log_path = tmp_path_factory.mktemp("islwatch-proxy") / f"{llama_server.family}.log"
    with running_proxy(llama_server.base_url, tokenizer, log_path) as proxy:
        yield proxy


@pytest.fixture(scope="session")
def llama_cpp_flavor_proxy(
    request: pytest.FixtureRequest, llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxy]:
    """The same proxy told which server it watches: `--server-flavor llama.cpp`."""
    tokenizer = str(request.getfixturevalue("family_tokenizer").name_or_path)
    log_path = tmp_path_factory.mktemp("islwatch-proxy-cpp") / f"{llama_server.family}.log"
    with running_proxy(
        llama_server.base_url, tokenizer, log_path, extra_args=("--server-flavor", "llama.cpp")
    ) as proxy:
        yield proxy
