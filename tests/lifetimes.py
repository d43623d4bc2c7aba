"""Heavy servers that one test directory needs, stopped when that directory's last test is done.

The vLLM and SGLang fixtures are session-scoped (started once, in parallel), but only their own directory
uses them: left up until the session ends, the four vLLM chat servers (~14 GB) would still hold their
memory while tests/vllm_vision starts its Qwen2-VL server (~4.3 GB) on a 23 GB machine. A fixture
registers its stop with `release_after_directory`; the root conftest's `pytest_runtest_teardown` calls
`release_finished` after every test. The stops are idempotent, so the fixture's own finalizer still runs.
Imported as `tests.lifetimes` everywhere, so there is one registry.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

_PENDING: dict[Path, list[Callable[[], None]]] = {}
# The node id of each directory's last test in the run's final order: pytest groups tests by the params of
# session fixtures, which interleaves directories (interop, sglang_server, vllm_server all take `family`).
_LAST: dict[str, Path] = {}


def release_after_directory(directory: Path, stop: Callable[[], None]) -> None:
    _PENDING.setdefault(directory.resolve(), []).append(stop)


def note_order(items: list[tuple[str, Path]]) -> None:
    """(node id, file) of every test, in the order they will run (pytest_collection_finish)."""
    last = {path.resolve().parent: nodeid for nodeid, path in items}
    _LAST.clear()
    _LAST.update({nodeid: directory for directory, nodeid in last.items()})


def release_finished(nodeid: str) -> None:
    """After each test: once a directory's last test is done, stop what it registered."""
    directory = _LAST.get(nodeid)
    if directory is not None:
        for stop in _PENDING.pop(directory, []):
            stop()
