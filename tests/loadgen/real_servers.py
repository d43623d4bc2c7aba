"""A real llama-server for the loadgen's dataset, trace and responses tests: Qwen2.5's tiny GGUF, one slot,
started by the interop helpers (tests/interop/llama_server_proc.py) and stopped by pid.

Skips only when the binary, the tiny GGUF or the test tokenizer is absent and cannot be built (fails under CI).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import load_shared, unavailable
from tests.interop.llama_server_proc import (
    BinaryUnavailable,
    find_binary,
    free_port,
    launch,
    stop,
    tiny_gguf,
    wait_healthy,
)

FAMILY = "qwen2.5-instruct"


@contextmanager
def qwen_llama_server(logs: Path) -> Iterator[tuple[str, Any]]:
    """(base URL, the family's tokenizer) of a running llama-server."""
    try:
        binary = find_binary()
    except BinaryUnavailable as exc:
        unavailable(str(exc))
    gguf = tiny_gguf(FAMILY)
    port = free_port()
    log = logs / "llama-server.log"
    proc = launch(binary, gguf, port, log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url, log)
        yield url, load_shared(FAMILY).tokenizer
    finally:
        stop(proc)
