"""The event loop islwatch's processes run on: uvloop, a dependency everywhere but Windows (pyproject.toml)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on uvloop (the stock loop on Windows, where uvloop does not exist)."""
    if sys.platform == "win32":
        return asyncio.run(coro)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)
