"""A real llama-server for the loadgen's dataset, trace and responses tests: Qwen2.5's tiny GGUF, one slot,
started by the interop helpers (tests/interop/llama_server_proc.py) and stopped by pid.

Skips only when the binary is absent and cannot be built, or the shared model or tokenizer is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import FIXTURES, load_shared, shared_dir, unavailable
from tests.interop.llama_server_proc import (
    GGUF,
    BinaryUnavailable,
    find_binary,
    free_port,
    launch,
    stop,
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
    gguf = FIXTURES / "gguf" / GGUF[FAMILY]
    if not gguf.is_file():
        unavailable(f"tiny GGUF model not present: {gguf}")
    shared_dir(FAMILY)  # skips when the shared tokenizers are absent
    port = free_port()
    log = logs / "llama-server.log"
    proc = launch(binary, gguf, port, log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url, log)
        yield url, load_shared(FAMILY).tokenizer
    finally:
        stop(proc)
